#!/usr/bin/env bash
# Every table of issues 27, 29 and 36 on a lent machine with 16 cores and one NVIDIA GPU, from
# a bare start, in one call (about 8.5 minutes; the device tool allows 10): the in-node table,
# dtrain beside serial NumPy, mpi4py and PyTorch DDP at 1, 4 and 16 workers (with 16 worker
# processes, one per core, each window a task per worker and its sums worker to worker, by the
# tree and in segments: issue 36's goal on P3), the one-GPU table, then the GPU tests.  Each
# section has its own time limit; a benchmark stopped by it still writes the tables of the
# runs it finished, headed PARTIAL.
#
# The machine has Python with torch, CuPy, NumPy, pandas, pyarrow, scikit-learn and mpi4py,
# no network, and no dask, distributed or bokeh: those come as wheels carried in .whl/, and
# MNIST's t10k files in .data/mnist/ (both git-ignored; benchmarks/README.md, "On a lent GPU
# machine", says how to make them).  Run from the repository root:
#
#     DTRAIN_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device.sh
#
# The results are made in /tmp/dtrain-bench; eight files of them are copied to $OUT (the
# device tool's folder, which brings back at most eight) or benchmarks/results-device/.
set -uo pipefail
cd "$(dirname "$0")/.."
keep=${OUT:-benchmarks/results-device}
workers=${WORKERS:-1,4,16}                 # WORKERS=1,2 QUICK=--quick: a dry run anywhere
quick=${QUICK:-}
top=${workers##*,}
cpu_contenders=${CPU_CONTENDERS:-serial,dtrain-default,mpi-allreduce,torch-ddp@$top,dtrain-allreduce@$top,dtrain-allreduce-segments@$top}
tests=${TESTS:-tests/test_device.py tests/test_passes.py tests/test_span.py}
out=/tmp/dtrain-bench
rm -rf "$out"; mkdir -p "$out" "$keep"
began=$SECONDS
say() { echo; echo "=== $* ($((SECONDS - began)) s)"; }

say "install the carried wheels"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/dtrain-site .whl/*.whl || { echo "device.sh: the wheels in .whl/ did not install"; exit 1; }
export PYTHONPATH=/tmp/dtrain-site:$PWD PATH=/tmp/dtrain-site/bin:$PATH PYTHONUNBUFFERED=1
export DTRAIN_COMMIT=${DTRAIN_COMMIT:-unknown}
[ -f .data/mnist/t10k-images-idx3-ubyte.gz ] || { echo "device.sh: no .data/mnist/ carried"; exit 1; }

say "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 - <<'EOF'
import os, platform
from importlib import metadata
print(platform.python_version(), os.cpu_count(), "cores")
for d in ("numpy", "dask", "distributed", "cupy-cuda13x", "torch", "mpi4py", "mpich"):
    try:
        print(f"  {d} {metadata.version(d)}")
    except metadata.PackageNotFoundError:
        print(f"  {d} -")
import dtrain.core.arrays as a
print("  CuPy GPUs:", a.gpu_count(), a.gpu_problem())
EOF

OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 30 mpiexec --oversubscribe -n 2 python3 -c "from mpi4py import MPI; c = MPI.COMM_WORLD; \
print('mpi rank', c.Get_rank(), 'of', c.Get_size(), MPI.Get_library_version().split(chr(10))[0])"

say "inside one node"
timeout 45 python3 -m benchmarks.innode "$top" | tee "$out/innode.md"
cp "$out/innode.md" "$keep/innode.md"

say "dtrain beside serial NumPy, mpi4py and PyTorch DDP ($workers workers)"
timeout 290 python3 -m benchmarks $quick --workloads P1,P2,P3 --workers "$workers" \
    --contenders "$cpu_contenders" \
    --data-dir .data --out "$out/cpu" --timeout 120 > "$out/cpu.log" 2> "$out/cpu.err"
sed -n '1,/^### P1/p' "$out/cpu/results.md" | head -n -1
grep -A 30 "^### Strong scaling" "$out/cpu/results.md" | head -12
grep -A 16 "^### Across workers" "$out/cpu/results.md"
grep -E "failed|warning" "$out/cpu.err" | head -5
cp "$out/cpu/results.md" "$keep/cpu.md"; cp "$out/cpu/results.json" "$keep/cpu.json"
cp "$out/cpu/results-speedup.png" "$keep/cpu-speedup.png"

say "one GPU"
timeout 200 python3 -m benchmarks $quick --workloads P1,P2,P3,P4 --workers "$top" \
    --contenders dtrain-gpu,dtrain-auto,torch-gpu,cupy-floor \
    --data-dir .data --out "$out/gpu" --timeout 90 > "$out/gpu.log" 2> "$out/gpu.err"
sed -n '1,/^### P1/p' "$out/gpu/results.md" | head -n -1
grep -E "failed|warning" "$out/gpu.err" | head -5
cp "$out/gpu/results.md" "$keep/gpu.md"; cp "$out/gpu/results.json" "$keep/gpu.json"
python3 - "$out" <<'EOF'
import json, sys
for run in json.load(open(f"{sys.argv[1]}/gpu/results.json"))["runs"]:
    if run["contender"] == "dtrain-auto" and run["status"] == "ok":
        import pathlib
        d = pathlib.Path(sys.argv[1]) / "gpu" / "runs" / run["workload"] / f"{run['workers']}w" / "dtrain-auto" / "r0"
        s = json.loads((d / "summary.json").read_text())
        print(run["workload"], "auto chose:", (s.get("device_choice") or {}).get("why"))
EOF

say "tests on the GPU and the core processes"
timeout 60 python3 -m pytest -q -p no:cacheprovider $tests > "$out/tests.txt" 2>&1
tail -15 "$out/tests.txt"; cp "$out/tests.txt" "$keep/tests.txt"

cat "$out"/*.err > "$keep/stderr.txt"
say "done"
