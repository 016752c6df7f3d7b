"""smg_trio.gateway."""
