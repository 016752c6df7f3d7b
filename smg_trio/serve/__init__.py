"""smg_trio.serve."""
