"""CPU and GPU workers in one run (``cluster.device = "auto"``); on a machine without a GPU
it says so and trains on CPU workers alone.

    python examples/cpu_and_gpu.py                     # pip install -e ".[gpu]" for CuPy

With ``auto``, every visible GPU gets a worker of its own and CPU workers make up the rest
of ``cluster.workers``; a short calibration times a forward-backward pass on each, and
shards are assigned in proportion to the measured speed, so neither kind waits for the other.
``model.dtype = "auto"`` trains in float32 where the run uses GPUs, float64 on CPUs alone.
"""
import dtrain
from dtrain.core.arrays import gpu_count


def main() -> None:
    gpus = gpu_count()          # 0 where there is no GPU or CuPy cannot be loaded
    if gpus:
        print(f"{gpus} GPU(s) here: one worker each, and CPU workers beside them")
    else:
        print("no GPU here (or CuPy cannot be loaded): training on CPU workers only")
    cfg = dtrain.load_config(
        {"data": {"dataset": "digits", "shards": 8}, "model": {"layers": [64, 32, 10]},
         "train": {"epochs": 3, "batch_size": 64},
         "cluster": {"device": "auto", "workers": gpus + 1}})   # the GPUs and one CPU worker
    result = dtrain.train(cfg, echo=None)
    print(f"dtype {cfg.model.dtype}, test accuracy {result.summary['test_accuracy']:.4f}")
    for worker, share in (result.summary.get("work_split") or {}).items():
        print(f"  {worker}: {share}")


if __name__ == "__main__":      # the LocalCluster's worker processes import this file
    main()
