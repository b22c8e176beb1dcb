#!/usr/bin/env bash
# dtrain on SLURM, the MPI way: one job; mpiexec starts the head and one worker rank per node.
#
#   sbatch jobqueue/slurm.sh --config configs/mnist.toml --set data.path=/data/mnist
#
# Layout (recommended; MPI + threads scaled best): every node runs one worker rank whose BLAS
# uses all the node's cores, with one Dask thread; the head (scheduler + driver, light) is
# one more rank that shares the first node.  Keep ntasks = nodes + 1 when changing them.
#SBATCH --job-name=dtrain
#SBATCH --nodes=4
#SBATCH --ntasks=5
#SBATCH --exclusive
#SBATCH --time=01:00:00
#SBATCH --output=dtrain-%j.log

set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"

# MPI: the mpiexec that `pip install -e ".[mpi]"` put into .venv needs nothing more.  To use
# the cluster's own MPI instead (README, "On a cluster"), load it and say how to launch, e.g.
#   module load openmpi
#   DTRAIN_MPIEXEC=mpirun
VENV=${DTRAIN_VENV:-.venv}
MPIEXEC=${DTRAIN_MPIEXEC:-$VENV/bin/mpiexec}

# Threads per worker: BLAS threads = the cores of a node (override with DTRAIN_THREADS).
THREADS=${DTRAIN_THREADS:-${SLURM_CPUS_ON_NODE:-1}}
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS

# shellcheck disable=SC2086  # MPIEXEC may carry options ("srun --mpi=pmix")
exec $MPIEXEC -n "${SLURM_NTASKS:?submit this script with sbatch}" \
    "$VENV/bin/python" -m dtrain --scheduler-rank 0 "$@"
