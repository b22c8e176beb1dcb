#!/usr/bin/env bash
# dtrain on SLURM, the MPI way: one job; mpiexec starts the head and one worker rank per node.
#
#   sbatch jobqueue/slurm.sh --config configs/mnist.toml --set data.path=/data/mnist --out runs/mnist
#
# Layout (cluster.layout = "hybrid", the default; MPI + threads scaled best): every node runs
# one worker rank, a Dask worker with a thread per core of the node; the head (scheduler +
# driver, light) is one more rank that shares the first node.  Keep ntasks = nodes + 1 when
# changing them, and give the run at least nodes x cores shards (data.shards) so every
# thread has its own.  Extra ranks on a node start no worker (they leave their cores to the
# node's worker rank); for one single-thread worker per core instead, pass
# --set cluster.layout=flat and ask for ntasks = nodes x cores + 1.  If your launcher binds
# each rank to one core (srun's default on some sites, Open MPI's for few ranks), run it
# unbound (DTRAIN_MPIEXEC="srun --cpu-bind=none", mpirun --bind-to none): the worker rank's
# threads can only use the cores it may run on.
#
# Walltime and preemption: 120 s before the walltime SLURM sends SIGUSR1 to this script,
# which passes it on; dtrain saves a checkpoint at the next step boundary and exits 75, and
# the script requeues the job.  The requeued job (the same job id) runs this script again,
# which resumes the same run directory (--out, or runs/slurm-<job id>) until it has
# finished: the final params.npz is the one an uninterrupted run would give.  Raise the 120
# if a window of your steps (graph.window; about a second by default, at least 100 steps)
# takes longer.
#SBATCH --job-name=dtrain
#SBATCH --nodes=4
#SBATCH --ntasks=5
#SBATCH --exclusive
#SBATCH --time=01:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=dtrain-%j.log

set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"

# MPI: the mpiexec that `pip install -e ".[mpi]"` put into .venv needs nothing more.  To use
# the cluster's own MPI instead (docs/cluster.md, "On a cluster"), load it and say how to launch, e.g.
#   module load openmpi
#   DTRAIN_MPIEXEC=mpirun
VENV=${DTRAIN_VENV:-.venv}
MPIEXEC=${DTRAIN_MPIEXEC:-$VENV/bin/mpiexec}

# Threads: a worker's Dask threads are its node's cores (DTRAIN_THREADS=N sets them: it is
# cluster.threads_per_worker); BLAS runs one thread in every worker, since its result bits
# depend on its thread count and params.npz must not depend on the layout.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

# The run directory: --out if given, else one named after the job.  A directory this job
# already started is resumed with the same arguments (only where it runs may change).
args=() out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out=$2; shift 2 ;;
        --out=*) out=${1#--out=}; shift ;;
        *) args+=("$1"); shift ;;
    esac
done
if [ -n "${DTRAIN_THREADS:-}" ]; then
    args+=(--set "cluster.threads_per_worker=$DTRAIN_THREADS")
fi
out=${out:-runs/slurm-${SLURM_JOB_ID:-local}}
if [ -f "$out/summary.json" ]; then
    echo "dtrain: $out has finished; nothing to do"
    exit 0
elif [ -f "$out/config.toml" ]; then
    echo "dtrain: resuming $out (restart ${SLURM_RESTART_COUNT:-0} of job ${SLURM_JOB_ID:-?})"
    args+=(--resume "$out")
else
    args+=(--out "$out")
fi

# shellcheck disable=SC2086  # MPIEXEC may carry options ("srun --mpi=pmix")
$MPIEXEC -n "${SLURM_NTASKS:?submit this script with sbatch}" \
    "$VENV/bin/python" -m dtrain --scheduler-rank 0 "${args[@]}" &
child=$!
trap 'kill -USR1 "$child" 2>/dev/null || true' USR1 TERM    # mpiexec passes it to every rank
rc=0
wait "$child" || rc=$?
while kill -0 "$child" 2>/dev/null; do        # a trapped signal ends `wait` early
    rc=0
    wait "$child" || rc=$?
done
if [ "$rc" -eq 75 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    echo "dtrain: stopped before the walltime; requeueing job $SLURM_JOB_ID to resume $out"
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$rc"
