#!/usr/bin/env bash
# The fuzz lane: schemathesis against `serve --backend mock` (loopback only), then a keyed pass.
# Fails on any 5xx, any error body outside the OpenAI envelope, any response slower than
# SMG_TRIO_FUZZ_MAX_RESPONSE_S, a run past its time bound, a route that takes a missing or
# wrong key, or a raw byte sequence that stops the server or floods its log. See docs/security.md ("Fuzz lane"). Usage: bash .ci/fuzz.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

MAX_EXAMPLES="${SMG_TRIO_FUZZ_MAX_EXAMPLES:-100}"   # per operation and phase
MAX_RESPONSE_S="${SMG_TRIO_FUZZ_MAX_RESPONSE_S:-5}"
RUN_BOUND_S="${SMG_TRIO_FUZZ_RUN_BOUND_S:-180}"      # wall bound of one schemathesis run
SEED="${SMG_TRIO_FUZZ_SEED:-$RANDOM$RANDOM}"
KEY="fuzz-key-$RANDOM$RANDOM"
ADMIN_KEY="fuzz-admin-$RANDOM$RANDOM"
t0=$(date +%s)

if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
.venv/bin/pip install -q -e '.[test,fuzz]'

work="$(mktemp -d)"  # 0700: the servers' socket dirs and logs
admin_sock="$(mktemp -d)"  # 0700: the socket dir of the server whose admin API is fuzzed keyed
pids=()
cleanup() {
  local pid deadline
  for pid in "${pids[@]}"; do
    # a server run under strace: signal the traced serve itself (strace only passes it on
    # when it exits), then strace
    if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = strace ]; then
      pkill -TERM -P "$pid" 2>/dev/null || true
    fi
    kill -TERM "$pid" 2>/dev/null || true
  done
  deadline=$(($(date +%s) + 30))  # serve drains and stops in well under that
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "fuzz: server $pid did not stop; killing it" >&2
      pkill -KILL -P "$pid" 2>/dev/null || true
      kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$work" "$admin_sock"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_server NAME [serve flags...]: serve the mock on 127.0.0.1:<free port>; sets $base and
# $server_pid. The mock engine runs flat out with a 512-token context, so every generation is
# short. $SOCKET_DIR overrides the socket dir; $TRACE names an strace log to run it under.
start_server() {
  local name=$1
  shift
  local -a trace=()
  if [ -n "${TRACE:-}" ]; then
    trace=(strace -f -qq -y -s 4096 -e signal=none --seccomp-bpf -o "$TRACE"
      -e trace=bind,mkdir,mkdirat,rmdir,unlink,unlinkat,rename,renameat,renameat2,link,linkat,symlink,symlinkat,creat,open,openat,mknod,mknodat)
  fi
  "${trace[@]}" .venv/bin/python -m smg_trio serve --backend mock --host 127.0.0.1 --port 0 \
    --socket-dir "${SOCKET_DIR:-$work/$name-sock}" "$@" -- --step-ms 0 --max-model-len 512 \
    >"$work/$name.log" 2>&1 &
  pids+=($!)
  server_pid=$!
  local pid=$! deadline=$(($(date +%s) + 60))
  base=""
  while [ -z "$base" ]; do
    base=$(grep -o 'smg_trio ready on http://[^ ]*' "$work/$name.log" | sed 's/^smg_trio ready on //') || true
    if [ -n "$base" ]; then break; fi
    if ! kill -0 "$pid" 2>/dev/null || [ "$(date +%s)" -ge "$deadline" ]; then
      echo "fuzz: the $name server did not become ready:" >&2
      tail -30 "$work/$name.log" >&2
      exit 1
    fi
    sleep 0.2
  done
  echo "fuzz: $name server on $base"
}

failed=()

# run_schemathesis LABEL [schemathesis args...]
run_schemathesis() {
  local label=$1
  shift
  echo "fuzz: schemathesis ($label), seed $SEED"
  local rc=0
  SCHEMATHESIS_HOOKS=fuzz_checks PYTHONPATH=.ci SMG_TRIO_FUZZ_MODEL=mock-tiny \
    timeout -k 10 "$RUN_BOUND_S" .venv/bin/schemathesis run "$base/openapi.json" \
    --checks not_a_server_error,openai_error_envelope \
    --max-response-time "$MAX_RESPONSE_S" --request-timeout 30 \
    --max-examples "$MAX_EXAMPLES" --seed "$SEED" --workers 2 \
    --generation-database none \
    --no-color "$@" || rc=$?
  if [ "$rc" -ne 0 ]; then
    failed+=("schemathesis $label (rc $rc; 124: the run passed its ${RUN_BOUND_S} s bound)")
  fi
}

# Pass 1: no --api-key. The admin API is behind --admin-api-key: here its mutating routes are
# fuzzed without the key (they must answer 401 envelopes), its reads with it.
start_server open --admin-api-key "$ADMIN_KEY"
run_schemathesis open
# (One name filter: schemathesis ORs separate --include-* filters.)
run_schemathesis admin-reads -H "Authorization: Bearer $ADMIN_KEY" \
  --include-name-regex '^GET /(workers|get_loads)'

# Pass 2: the admin mutations (POST and DELETE /workers) WITH the admin key, on a server of
# their own whose socket dir is a private mktemp dir. Worker specs are confined
# (smg_trio/worker/confine.py, issue 18 item 2): whatever a spec names, the gateway creates,
# unlinks and binds only under that dir, and binds tcp only on loopback. The server runs under
# strace where it can (SMG_TRIO_FUZZ_STRACE=0: not); .ci/fuzz_confine.py then checks the trace
# for any name created, removed or bound elsewhere, that nothing listens beyond loopback, and
# that once the workers the fuzzer added are removed, what listens is what listened before.
# Without strace, a listing of /tmp before and after stands in for the trace.
trace_log=""
if [ "${SMG_TRIO_FUZZ_STRACE:-1}" != 0 ] && strace -f -qq -o /dev/null true 2>/dev/null; then
  trace_log="$work/admin.strace"
fi
tmp_before="$work/tmp-before"
ls -A /tmp | sort >"$tmp_before"
SOCKET_DIR="$admin_sock" TRACE="$trace_log" start_server admin --admin-api-key "$ADMIN_KEY"
admin_pid=$server_pid
.venv/bin/python .ci/fuzz_confine.py snapshot "$admin_pid" "$work/admin.snap" "$base" "$ADMIN_KEY"
run_schemathesis admin-mutations -H "Authorization: Bearer $ADMIN_KEY" \
  --include-name-regex '^(POST|DELETE) /workers'
if ! .venv/bin/python .ci/fuzz_confine.py check "$admin_pid" "$work/admin.snap" "$base" \
  "$ADMIN_KEY" "$admin_sock" ${trace_log:+"$trace_log"}; then
  failed+=("admin confinement")
fi
if [ -z "$trace_log" ]; then
  new=$(ls -A /tmp | sort | comm -13 "$tmp_before" - | grep -vxF -e "$(basename "$work")" \
    -e "$(basename "$admin_sock")" || true)
  if [ -n "$new" ]; then
    echo "fuzz: new in /tmp during the admin pass:" "$new"
    failed+=("admin confinement (/tmp)")
  fi
fi

# Pass 3: --api-key (from the environment), which also guards the admin API.
SMG_TRIO_API_KEY="$KEY" start_server keyed
if ! PYTHONPATH=.ci timeout -k 5 60 .venv/bin/python .ci/fuzz_auth.py "$base" "$KEY"; then
  failed+=("keyed pass")
fi

# Pass 4: raw bytes (issue 28 item 3): malformed and random byte sequences, one connection
# each, against the fast path and against hypercorn alone (--disable-fast-http1). The process
# must survive, answer GET /health afterwards, and log little and no traceback.
raw_seed="${SMG_TRIO_FUZZ_SEED:-$RANDOM}"
for mode in fast h1; do
  if [ "$mode" = fast ]; then start_server raw-$mode; else start_server raw-$mode --disable-fast-http1; fi
  if ! timeout -k 5 90 .venv/bin/python .ci/fuzz_raw.py "$base" "$server_pid" \
    "$work/raw-$mode.log" "$raw_seed"; then
    failed+=("raw bytes ($mode)")
  fi
done

for name in open admin keyed raw-fast raw-h1; do
  if grep -q "Traceback" "$work/$name.log"; then
    echo "fuzz: the $name server logged tracebacks (first 40 lines):"
    grep -m1 -A40 "Traceback" "$work/$name.log"
  fi
done
echo "fuzz lane: $(($(date +%s) - t0)) s"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'fuzz lane FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "fuzz lane: green"
