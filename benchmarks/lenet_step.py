"""One LeNet-5 training step on one thread: dtrain's maths beside PyTorch's (oneDNN).

``python -m benchmarks.lenet_step [--batch B] [--repeat R] [--steps N] [--clock cpu]``

The net of ``configs/mnist-cnn.toml`` (float32, ReLU, softmax cross-entropy) at batch ``B``
(64), one thread each (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``,
``torch.set_num_threads(1)``), on the same random rows.  A dtrain step is
:meth:`~dtrain.maths.model.Network.loss_and_grad` and the update (SGD with momentum, as the
config's); PyTorch's is ``zero_grad``, forward, ``backward`` and ``SGD.step``.  The two
alternate ``R`` times (a shared machine's load falls on both), each round the median of
``N`` steps; it prints each round and the medians' ratio.  Goal (issue 52): at most 2.
``--clock cpu`` times the thread's CPU time instead of the wall clock: on a machine other
work is loading, the time a step waited for a core is left out of both.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")           # before NumPy loads its BLAS
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import statistics   # noqa: E402
import sys          # noqa: E402
import time         # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.common import OneLineParser, positive  # noqa: E402

GOAL = 2.0


def _median_ms(step, steps: int, clock=time.perf_counter) -> float:
    step()                                          # warm up: buffers, kernels
    times = []
    for _ in range(steps):
        t0 = clock()
        step()
        times.append(clock() - t0)
    return 1e3 * statistics.median(times)


def contenders(batch: int):
    """``(dtrain_step, torch_step)`` for LeNet-5 at ``batch`` rows."""
    import torch

    import dtrain
    from dtrain.core.config import CONFIG_DIR
    from dtrain.maths.model import Network
    from dtrain.maths.optim import Optimizer, Step, update

    torch.set_num_threads(1)
    cfg = dtrain.load_config(CONFIG_DIR / "mnist-cnn.toml")
    net = Network.from_config(cfg.model)
    opt = Optimizer(cfg.optim, net, 0.0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, net.features)).astype(np.float32)       # (B, 784)
    y = rng.integers(0, net.outputs, batch)
    state = [opt.init_state(net.init(0))]
    step = Step(0, 0, 0, cfg.optim.lr, batch, True, True, ())

    def ours() -> None:
        grad = net.loss_and_grad(opt.params(state[0]), x, y)
        state[0] = update(opt, step, True, state[0], grad)

    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                          nn.Linear(84, 10))
    sgd = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr, momentum=cfg.optim.momentum)
    tx, ty = torch.from_numpy(x).reshape(batch, 1, 28, 28), torch.from_numpy(y)

    def theirs() -> None:
        sgd.zero_grad()
        nn.functional.cross_entropy(model(tx), ty).backward()
        sgd.step()

    return ours, theirs


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.lenet_step",
                           description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=positive, default=64, help="rows a step (default 64)")
    parser.add_argument("--repeat", type=positive, default=5, help="alternated rounds")
    parser.add_argument("--steps", type=positive, default=30, help="steps a round")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall clock (default) or this thread's CPU time")
    args = parser.parse_args(argv)
    try:
        ours, theirs = contenders(args.batch)
    except ImportError as exc:
        parser.error(f"needs PyTorch ({exc}): pip install torch")
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    rounds = []
    for r in range(args.repeat):
        a, b = _median_ms(ours, args.steps, clock), _median_ms(theirs, args.steps, clock)
        rounds.append((a, b))
        print(f"round {r + 1}: dtrain {a:.2f} ms  torch {b:.2f} ms  ratio {a / b:.2f}",
              flush=True)
    a = statistics.median(r[0] for r in rounds)
    b = statistics.median(r[1] for r in rounds)
    verdict = "met" if a / b <= GOAL else "missed"
    print(f"LeNet-5 step at batch {args.batch}, one thread ({args.clock} clock): dtrain "
          f"{a:.2f} ms, PyTorch "
          f"{b:.2f} ms, ratio {a / b:.2f} (goal <= {GOAL:g}: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
