"""Repository-only tooling for the real peers (vLLM, TokenSpeed's transport, the Rust smg):
their virtualenvs, launch commands and environments. Not part of the wheel."""
