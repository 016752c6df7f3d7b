"""smg_trio.codec."""
