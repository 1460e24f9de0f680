#!/bin/bash
# loopscale run on a SLURM allocation: Ray head on the first node, Ray workers on the others, then the whole
# measurement (LR tuning -> grid -> fits -> report). Not `loopscale sweep` alone: with a spec that has `lr: tune`
# (configs/paper.yaml) it exits 2 at once on a new OUT (no LR table), after the nodes were allocated.
#
#   sbatch cluster/recipes/slurm-sbatch.sh configs/paper.yaml /shared/fs/loopscale/paper
#
# Arguments: SPEC (a sweep YAML) and OUT (a directory on a filesystem every node mounts: Tune state and
# trial checkpoints go to OUT/tune, so a trial restarted on another node finds its checkpoint).
# SPEC: configs/paper.yaml trains on the small embedded corpus (`--dry-run` warns of ~490 epochs at the paper's
# budgets); for the paper's measurement give a copy whose `corpus:` is a path every node mounts. Each node
# tokenizes it once into LOOPSCALE_CACHE, set below to node-local disk ($TMPDIR), not the shared home.
# Re-submitting with the same OUT (after preemption or the time limit) resumes: --resume restores Tune's
# interrupted experiment and finished runs are not trained again (on a new OUT it says there is nothing to
# resume and starts).
# The same spec runs on a laptop with `loopscale run SPEC --out ./runs/x` (embedded Ray).
# Submit from a shell whose `ray`, `python` and `loopscale` are loopscale's environment (e.g. after
# `source .venv/bin/activate` in a checkout on the shared filesystem): sbatch passes that environment on.
#
# Security: Ray token auth is forced on (RAY_AUTH_MODE=token). The token is ~/.ray/auth_token in your home
# directory (shared by the nodes; `ray get-auth-token --generate` creates it once, mode 600); it is never
# printed or passed on a command line. Ray listens on the compute nodes' cluster-network address: run this
# only on a cluster network that untrusted hosts cannot reach.
#
#SBATCH --job-name=loopscale-run
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=96
#SBATCH --time=48:00:00
#SBATCH --output=loopscale-run-%j.out

set -euo pipefail

SPEC="${1:?usage: sbatch slurm-sbatch.sh SPEC OUT}"
OUT="${2:?usage: sbatch slurm-sbatch.sh SPEC OUT}"
GPUS_PER_NODE="${SLURM_GPUS_ON_NODE:-8}"
CPUS_PER_NODE="${SLURM_CPUS_PER_TASK:-96}"
RAY_PORT=6379

export RAY_AUTH_MODE=token
export LOOPSCALE_CACHE="${LOOPSCALE_CACHE:-${TMPDIR:-/tmp}/loopscale-cache-${USER:-$(id -un)}}"   # srun steps inherit it
if [[ -z "${RAY_AUTH_TOKEN:-}" && -z "${RAY_AUTH_TOKEN_PATH:-}" ]]; then   # else Ray takes the token from there
  ray get-auth-token --generate >/dev/null   # no-op if ~/.ray/auth_token exists; never echo the token
  chmod 600 "$HOME/.ray/auth_token"
fi

mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
HEAD_NODE="${NODES[0]}"
HEAD_IP="$(srun --nodes=1 --ntasks=1 -w "$HEAD_NODE" hostname --ip-address | awk '{print $1}')"
# a hostname that /etc/hosts maps to loopback (127.0.1.1 on Debian) gives no address the workers can reach: take
# the node's first non-loopback address instead
if [[ -z "$HEAD_IP" || "$HEAD_IP" == 127.* || "$HEAD_IP" == ::1 ]]; then
  HEAD_IP="$(srun --nodes=1 --ntasks=1 -w "$HEAD_NODE" hostname --all-ip-addresses | awk '{print $1}')"
fi
if [[ -z "$HEAD_IP" || "$HEAD_IP" == 127.* || "$HEAD_IP" == ::1 ]]; then
  echo "no address of ${HEAD_NODE} that other nodes can reach (hostname --ip-address gives loopback)" >&2
  exit 1
fi
HEAD_ADDRESS="${HEAD_IP}:${RAY_PORT}"
echo "Ray head on ${HEAD_NODE} (${HEAD_ADDRESS}); ${#NODES[@]} nodes"

# Head: also runs trials (it has GPUs too). --block keeps the srun step alive as long as Ray runs. Each step asks
# for the node's CPUs and GPUs itself: since Slurm 22.05 a step does not inherit the job's --cpus-per-task.
srun --nodes=1 --ntasks=1 -w "$HEAD_NODE" --cpus-per-task="$CPUS_PER_NODE" --gpus-per-node="$GPUS_PER_NODE" \
  ray start --head --node-ip-address="$HEAD_IP" --port="$RAY_PORT" \
  --num-cpus="$CPUS_PER_NODE" --num-gpus="$GPUS_PER_NODE" --dashboard-host=127.0.0.1 --block &
# wait until the head answers: `ray status` exits 0 once it reaches the head (a fixed sleep let a slow head fail the
# driver's reachability check: exit 2); one try at a head not yet listening can itself take ~40 s
HEAD_WAIT_S="${HEAD_WAIT_S:-300}"
wait_from=$SECONDS
until ray status --address "$HEAD_ADDRESS" >/dev/null 2>&1; do
  if (( SECONDS - wait_from >= HEAD_WAIT_S )); then
    echo "Ray head at $HEAD_ADDRESS not up after $((SECONDS - wait_from)) s" >&2
    exit 1
  fi
  sleep 5
done

# Workers: one ray start per remaining node.
for node in "${NODES[@]:1}"; do
  srun --nodes=1 --ntasks=1 -w "$node" --cpus-per-task="$CPUS_PER_NODE" --gpus-per-node="$GPUS_PER_NODE" \
    ray start --address="$HEAD_ADDRESS" \
    --num-cpus="$CPUS_PER_NODE" --num-gpus="$GPUS_PER_NODE" --block &
  sleep 5
done
# wait until every node has joined (a worker that cannot reach the head fails in its own step, and the grid would
# run on fewer nodes without a word); after WORKERS_WAIT_S the run goes on with the nodes there, and says so
WORKERS_WAIT_S="${WORKERS_WAIT_S:-300}"
wait_from=$SECONDS
while :; do
  joined="$(python -c 'import sys, ray; ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(sum(n["Alive"] for n in ray.nodes()))' "$HEAD_ADDRESS" 2>/dev/null || echo 0)"
  (( joined >= ${#NODES[@]} )) && break
  if (( SECONDS - wait_from >= WORKERS_WAIT_S )); then
    echo "warning: ${joined} of ${#NODES[@]} Ray nodes joined after $((SECONDS - wait_from)) s; the run goes on with them" >&2
    break
  fi
  sleep 10
done

# The driver runs in the batch step on the head node and joins the cluster.
status=0
loopscale run "$SPEC" --out "$OUT" --address "$HEAD_ADDRESS" --resume || status=$?

# Stop the Ray nodes this job started (the srun steps above: `ray start --block` stops what it started on a
# SIGTERM), not every Ray of this user on the node, as `ray stop` would on a node shared with other jobs.
kill $(jobs -p) 2>/dev/null || true
wait || true
exit $status
