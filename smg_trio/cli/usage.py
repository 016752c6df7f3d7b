"""The CLI's usage errors: exit 2 with ``smg_trio: error: MESSAGE`` on stderr."""

from __future__ import annotations

import sys
from typing import NoReturn


def _usage_error(message: str) -> NoReturn:
    """Exit 2 (argparse's usage-error status) with ``smg_trio: error: MESSAGE``."""
    print(f"smg_trio: error: {message}", file=sys.stderr)
    raise SystemExit(2)
