#!/usr/bin/env bash
# MNIST under mpiexec on one machine: rank 0 is the head (the Dask scheduler and the training
# driver), rank 1 a Dask worker with a thread per core (the hybrid layout, the default).
#
#   bash examples/mnist_mpiexec.sh /data/mnist        # a directory of MNIST's IDX files
#
# Needs `pip install -e ".[mpi]"` (mpi4py and the MPICH wheel's mpiexec).  On several nodes,
# start one rank per node plus the head (see examples/slurm_mnist.sh); for a single-thread
# worker per rank instead, add --set cluster.layout=flat and start a rank per core.
# Variables: EPOCHS (default 8), RANKS (default 2), OUT (default runs/mnist-mpi), and
# MPIEXEC and PYTHON (default: the ones in .venv).
set -euo pipefail
DATA=${1:?usage: $0 MNIST_DIR}
repo=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$repo/.venv/bin/python}
MPIEXEC=${MPIEXEC:-$(dirname "$PYTHON")/mpiexec}

$MPIEXEC -n "${RANKS:-2}" "$PYTHON" -m dtrain --scheduler-rank 0 \
    --config "$repo/configs/mnist.toml" --set data.path="$DATA" \
    --set train.epochs="${EPOCHS:-8}" --out "${OUT:-runs/mnist-mpi}"
