"""smg_trio.tokenizer."""
