"""Black-box OpenAI-compatibility conformance runner for any gateway (smg_trio, Rust smg, others)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the conformance CLI (``http`` or ``wire``) and return its exit status."""
    from conformance.cli import main as cli_main

    return cli_main(argv)
