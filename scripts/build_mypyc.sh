#!/bin/sh
# Compile smg_trio's per-token hot modules with mypyc, in place (issue 31 experiment).
#
# Writes one extension module beside each listed .py (smg_trio/.../NAME.cpython-*.so, which
# Python imports instead of the .py) and the shared runtime smg_trio/_hot__mypyc.cpython-*.so;
# C sources and objects go to build/mypyc/. All of it is git-ignored (*.so, build/).
#
# Needs a C compiler (cc) and mypy in the venv (the test extra provides it):
#     scripts/build_mypyc.sh            # build (about a minute on one core)
#     scripts/build_mypyc.sh --clean    # UNDO: delete the .so files and build/mypyc
# Undo by hand: find smg_trio -name '*.so' -delete && rm -rf build/mypyc
#
# A built .so shadows its .py: after editing a listed module, rebuild or clean, or the old
# compiled code keeps running. PYTHON picks the interpreter (default .venv/bin/python); the
# .so files only load in that Python version.
#
# Not listed, and why (mypyc 2.x, CPython 3.11):
#   smg_trio/protocol/vllm.py: its msgspec.Struct classes become plain classes whose
#     __annotations__ mypyc rewrites to runtime classes (list[int] | None -> type), so
#     msgspec decodes EngineCoreRequest/EngineCoreOutputs wrongly ("Expected `type`, got
#     `list`"). Would compile if the Structs moved to a module that is not compiled.
#   smg_trio/connector/output.py: ClientOutput subclasses ClientAborts -> ClientConnections
#     -> ClientState; compiled alone mypyc fails (internal KeyError on an attribute of the
#     interpreted base). state/connections/aborts/output compile together, but EngineClient
#     (client.py: async generators, which mypyc cannot compile) subclasses them, so each
#     needs @mypyc_attr(allow_interpreted_subclasses=True) (mypy_extensions at run time).
#     Measured gain: 156 -> 130 ns per dispatched output; not worth the source change yet.
set -eu
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}

MODULES="
smg_trio/codec/msgpack.py
smg_trio/connector/stream.py
smg_trio/gateway/http/sse.py
smg_trio/gateway/openai/fanout.py
smg_trio/gateway/openai/framing.py
smg_trio/gateway/openai/textgen.py
smg_trio/gateway/server/direct.py
smg_trio/gateway/server/fast_http1.py
smg_trio/tokenizer/detokenizer.py
"

clean() {
    find smg_trio -name '*.so' -delete
    rm -rf build/mypyc
}

if [ "${1:-}" = "--clean" ]; then
    clean
    echo "removed the compiled modules; smg_trio runs as pure Python"
    exit 0
fi

clean  # no stale .so of a module dropped from the list
# shellcheck disable=SC2086  # MODULES is a whitespace-separated list on purpose
nice -n 19 "$PYTHON" - $MODULES <<'EOF'
import sys

from mypyc.build import mypycify
from setuptools import setup

setup(
    name="smg_trio_mypyc",
    ext_modules=mypycify(
        sys.argv[1:], opt_level="3", group_name="smg_trio._hot", target_dir="build/mypyc"
    ),
    script_args=[
        "build_ext",
        "--inplace",
        "--build-temp=build/mypyc/temp",
        "--build-lib=build/mypyc/lib",
    ],
)
EOF
"$PYTHON" -c 'import smg_trio.gateway.openai.textgen as m; assert m.__file__.endswith(".so"), m.__file__'
echo "built: $(find smg_trio -name '*.so' | wc -l) extension modules (undo: $0 --clean)"
