#!/usr/bin/env bash
# dtrain on PBS (PBS Pro / OpenPBS), the MPI way: one job; mpiexec starts the head and one
# worker rank per node.  qsub passes no arguments to a script, so DTRAIN_ARGS carries them:
#
#   qsub -v DTRAIN_ARGS="--config configs/mnist.toml --set data.path=/data/mnist" jobqueue/pbs.sh
#
# Layout (cluster.layout = "hybrid", the default; MPI + threads scaled best): 4 nodes, each
# running one worker rank, a Dask worker with a thread per core of its chunk (ncpus); the head
# (scheduler + driver, light) is a second MPI process on the first node: hence mpiprocs=2 in
# the first chunk.  Give the run at least nodes x ncpus shards (data.shards).  For one
# single-thread worker per core instead, add --set cluster.layout=flat to DTRAIN_ARGS and
# mpiprocs = ncpus per chunk (+1 on the first).  (Torque: -l nodes=4:ppn=16, DTRAIN_RANKS=5.)
#PBS -N dtrain
#PBS -l select=1:ncpus=16:mpiprocs=2+3:ncpus=16:mpiprocs=1
#PBS -l walltime=01:00:00
#PBS -j oe

set -euo pipefail
cd "${PBS_O_WORKDIR:-.}"

# MPI: the mpiexec that `pip install -e ".[mpi]"` put into .venv needs nothing more.  To use
# the cluster's own MPI instead (docs/cluster.md, "On a cluster"), load it and say how to launch, e.g.
#   module load openmpi
#   DTRAIN_MPIEXEC=mpirun
VENV=${DTRAIN_VENV:-.venv}
MPIEXEC=${DTRAIN_MPIEXEC:-$VENV/bin/mpiexec}
RANKS=${DTRAIN_RANKS:-$(wc -l < "${PBS_NODEFILE:?submit this script with qsub}")}

# Threads: a worker's Dask threads are its chunk's cores (DTRAIN_THREADS=N sets them: it is
# cluster.threads_per_worker); BLAS runs one thread in every worker, since its result bits
# depend on its thread count and params.npz must not depend on the layout.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
THREADS=${DTRAIN_THREADS:+--set cluster.threads_per_worker=$DTRAIN_THREADS}

# shellcheck disable=SC2086  # MPIEXEC may carry options; DTRAIN_ARGS is a list of words
exec $MPIEXEC -n "$RANKS" "$VENV/bin/python" -m dtrain --scheduler-rank 0 ${DTRAIN_ARGS:-} \
    $THREADS
