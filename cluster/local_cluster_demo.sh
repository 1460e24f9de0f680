#!/usr/bin/env bash
# `loopscale sweep SPEC --address auto` against a Ray cluster started on this machine with `ray start --head`.
#
#   bash cluster/local_cluster_demo.sh            # `ray` and `loopscale` from PATH, else from the checkout's .venv
#   RAY=/work/venv/bin/ray LOOPSCALE=/work/venv/bin/loopscale bash cluster/local_cluster_demo.sh
#
# What it shows: the same spec and command as on a laptop; only `--address auto` is added, so the sweep's
# driver joins the running cluster instead of starting an embedded Ray, and leaves it running at the end.
#
# Isolation: RAY_TMPDIR points Ray's session directory *and* its address file (ray_current_cluster, which
# `--address auto` reads) at a fresh folder, so this demo never joins or disturbs another Ray on the machine.
# The head runs with --block in the background; the script stops exactly that process (SIGTERM, which makes
# it stop every Ray process it started), never `ray stop` (that stops every Ray of this user on the machine).
# Token auth stays at Ray's default (on when ~/.ray/auth_token exists; `ray get-auth-token --generate`).
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
WORK="$(mktemp -d /tmp/lsdemo.XXXXXX)"
export RAY_TMPDIR="$WORK"

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

"$RAY" start --head --num-cpus=2 --include-dashboard=false --disable-usage-stats --block >"$WORK/head.log" 2>&1 &
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
echo "cluster address: $(cat "$WORK/ray/ray_current_cluster")"

start=$(date +%s)
"$LOOPSCALE" sweep "$WORK/spec.yaml" --out "$WORK/out" --address auto --json | tee "$WORK/summary.json"
echo "sweep wall: $(( $(date +%s) - start )) s"

# the sweep joined the cluster, so it left it running
kill -0 "$HEAD_PID" && echo "cluster still running after the sweep (joined, not stopped); stopping it now"
echo "results: $WORK/out/runs.parquet"
