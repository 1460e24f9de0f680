#!/usr/bin/env bash
# `loopscale sweep SPEC --address HOST:PORT` against a Ray cluster started on this machine with `ray start --head`.
#
#   bash cluster/local_cluster_demo.sh            # `ray` and `loopscale` from PATH, else from the checkout's .venv
#   RAY=/work/venv/bin/ray LOOPSCALE=/work/venv/bin/loopscale bash cluster/local_cluster_demo.sh
#
# What it shows: the same spec and command as on a laptop; only `--address` is added, so the sweep's driver
# joins the running cluster instead of starting an embedded Ray, and leaves it running at the end.
#
# Isolation: the head gets a fresh RAY_TMPDIR (its session directory and its address file, ray_current_cluster)
# and a free GCS port (--port=0), and the sweep joins exactly that head by the HOST:PORT its address file names.
# Not `--address auto`: Ray resolves that from RAY_ADDRESS when set (another cluster), and with several Rays on
# the machine it scans their processes and prints "Found multiple active Ray instances: {...}. Connecting to
# latest cluster at ...". The head runs with --block in the background; the script stops exactly that process
# (SIGTERM, which makes it stop every Ray process it started), never `ray stop` (that stops every Ray of this
# user on the machine).
# Token auth: Ray's default for `ray start` (token when a token exists: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or
# ~/.ray/auth_token; `ray get-auth-token --generate` creates one), set explicitly in RAY_AUTH_MODE for the head
# and the driver alike, because a driver joining by HOST:PORT does not infer it (a RAY_AUTH_MODE you set is kept).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tool() {  # $1: the command's name; PATH first, then the README's quick-start venv in this checkout
  if command -v "$1" >/dev/null 2>&1; then command -v "$1"
  elif [[ -x "$REPO/.venv/bin/$1" ]]; then echo "$REPO/.venv/bin/$1"
  else echo "error: '$1' is neither on PATH nor in $REPO/.venv/bin; install loopscale (README quick start) or set ${2}=/path/to/$1" >&2; exit 2
  fi
}
RAY="${RAY:-$(tool ray RAY)}"
LOOPSCALE="${LOOPSCALE:-$(tool loopscale LOOPSCALE)}"
WORK="$(mktemp -d /tmp/lsdemo.XXXXXX)"  # under /tmp whatever TMPDIR says: Ray's socket paths must stay short
export RAY_TMPDIR="$WORK"
unset RAY_ADDRESS
if [[ -z "${RAY_AUTH_MODE:-}" ]]; then
  if [[ -n "${RAY_AUTH_TOKEN:-}" || -s "${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}" ]]; then
    export RAY_AUTH_MODE=token
  else
    export RAY_AUTH_MODE=disabled
  fi
fi

cat >"$WORK/spec.yaml" <<'YAML'
name: demo
model: {preset: cpu, seq_len: 32}
r: [1, 2]
sizes: [16]
tokens: [4096]
training: {batch_tokens: 256, eval_tokens: 1024, checkpoint_every_steps: 4}
lr: {fixed: 0.02}
resources: {cpus: 1}
max_failures: 1
YAML

"$RAY" start --head --port=0 --num-cpus=2 --include-dashboard=false --disable-usage-stats --block >"$WORK/head.log" 2>&1 &
HEAD_PID=$!
cleanup() {
  kill -TERM "$HEAD_PID" 2>/dev/null || true
  wait "$HEAD_PID" 2>/dev/null || true
}
trap cleanup EXIT

for _ in $(seq 1 120); do
  [[ -s "$WORK/ray/ray_current_cluster" ]] && break
  kill -0 "$HEAD_PID" 2>/dev/null || { echo "ray start failed:"; cat "$WORK/head.log"; exit 1; }
  sleep 0.5
done
[[ -s "$WORK/ray/ray_current_cluster" ]] || { echo "ray start wrote no address file in 60 s:"; cat "$WORK/head.log"; exit 1; }
ADDRESS="$(cat "$WORK/ray/ray_current_cluster")"
echo "cluster address: $ADDRESS (RAY_AUTH_MODE=$RAY_AUTH_MODE)"

start=$(date +%s)
"$LOOPSCALE" sweep "$WORK/spec.yaml" --out "$WORK/out" --address "$ADDRESS" --json | tee "$WORK/summary.json"
echo "sweep wall: $(( $(date +%s) - start )) s"

# the sweep joined the cluster, so it left it running
kill -0 "$HEAD_PID" && echo "cluster still running after the sweep (joined, not stopped); stopping it now"
echo "results: $WORK/out/runs.parquet (kept for you to read; $WORK also holds the head's Ray session folder:"
echo "delete it when done: rm -rf $WORK)"
