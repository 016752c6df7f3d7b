"""smg_trio.transport."""
