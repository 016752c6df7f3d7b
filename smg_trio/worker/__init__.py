"""smg_trio.worker."""
