"""smg_trio.testing."""
