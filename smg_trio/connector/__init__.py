"""smg_trio.connector."""
