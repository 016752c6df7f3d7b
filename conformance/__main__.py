"""``python -m conformance``: entry point that delegates to :func:`conformance.cli.main`."""

from __future__ import annotations

import sys

from conformance.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
