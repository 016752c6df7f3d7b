"""``python -m smg_trio`` → :func:`smg_trio.cli.main`."""

from __future__ import annotations

import sys

from smg_trio.cli import main

sys.exit(main())
