#!/usr/bin/env bash
# Set up .venv (idempotent) and run the test suite: `bash .ci/test.sh [pytest args]`.
# Works on a fresh clone; a rerun reuses the venv and only re-checks the install.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ ! -x .venv/bin/python ]; then
  # The first of $PYTHON, python3, python3.13, python3.12, python3.11 that is at least 3.11.
  py=""
  for cand in ${PYTHON:-} python3 python3.13 python3.12 python3.11; do
    if command -v "$cand" >/dev/null 2>&1 &&
      "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      py=$cand
      break
    fi
  done
  if [ -z "$py" ]; then
    echo "smg_trio needs Python >= 3.11: none of python3, python3.13, python3.12, python3.11 is" >&2
    exit 1
  fi
  "$py" -m venv .venv
fi
.venv/bin/pip install -q -e '.[test]'
exec .venv/bin/python -m pytest -q "$@"
