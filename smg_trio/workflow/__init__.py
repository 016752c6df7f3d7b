"""smg_trio.workflow."""
