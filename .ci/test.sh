#!/usr/bin/env bash
# Set up .venv (idempotent) and run the test suite: `bash .ci/test.sh [pytest args]`.
# Works on a fresh clone; a rerun reuses the venv and only re-checks the install.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q -e '.[test]'
exec .venv/bin/python -m pytest -q "$@"
