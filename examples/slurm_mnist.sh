#!/usr/bin/env bash
# MNIST on SLURM, the MPI way: one job; mpiexec starts the head rank (the Dask scheduler and
# the training driver) and one worker rank per node, each a Dask worker with a thread per
# core of its node (the hybrid layout, the default).
#
#   sbatch examples/slurm_mnist.sh /data/mnist       # from the repository's directory
#
# Keep ntasks = nodes + 1 when changing the nodes.  jobqueue/slurm.sh is the full script:
# it also requeues the job before its walltime and resumes the run.  Variables: EPOCHS
# (default 8), OUT (default runs/mnist-<job id>), DTRAIN_VENV (default .venv),
# DTRAIN_MPIEXEC (default the venv's mpiexec; e.g. "srun --mpi=pmix --cpu-bind=none").
#SBATCH --job-name=dtrain-mnist
#SBATCH --nodes=2
#SBATCH --ntasks=3
#SBATCH --exclusive
#SBATCH --time=00:30:00
#SBATCH --output=dtrain-mnist-%j.log
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"
DATA=${1:?usage: sbatch $0 MNIST_DIR}
VENV=${DTRAIN_VENV:-.venv}
MPIEXEC=${DTRAIN_MPIEXEC:-$VENV/bin/mpiexec}
# one BLAS thread per worker: BLAS's result bits depend on its thread count
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

# shellcheck disable=SC2086  # MPIEXEC may carry options
$MPIEXEC -n "${SLURM_NTASKS:?submit this script with sbatch}" "$VENV/bin/python" -m dtrain \
    --scheduler-rank 0 --config configs/mnist.toml --set data.path="$DATA" \
    --set train.epochs="${EPOCHS:-8}" --out "${OUT:-runs/mnist-${SLURM_JOB_ID:-local}}"
