"""Typed task records: what a graph builder bakes into each task, and what the task reads.

Every task of a training graph is ``Task(key, fn, record, *inputs)``: ``fn``
is one of the functions in :mod:`dtrain.taskgraph.tasks` (or the
model-parallel ones in :mod:`dtrain.taskgraph.modelparallel`), ``record`` is
that function's frozen dataclass below, holding the run's constants for this
task, and ``inputs`` are the values of its dependencies (``TaskRef``s that
Dask resolves), in the order the record's docstring gives.  A builder and a
task meet here, by field name, not by argument position.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dtrain.core.config import OptimConfig
from dtrain.core.events import StepEvents
from dtrain.data.shards import Shard, minibatch
from dtrain.maths.model import Network
from dtrain.maths.optim import Optimizer, Step
from dtrain.maths.slicing import Slicing


@dataclass(frozen=True)
class Group:
    """Shards that one task computes and sums as their reduce subtree would (one shard is a
    group of one).

    ``rows[p]`` are shard ``shards[p]``'s rows this step; ``tree`` nests the
    positions ``p`` as the tree groups them (``((0, 1), (2, 3))`` at fan-in 2;
    ``0`` for a group of one); ``threads``: compute the shards on up to this
    many of the worker's cores, in its core processes if ``processes``
    (:mod:`~dtrain.taskgraph.cores`), else on its threads.
    """

    shards: tuple[int, ...]
    rows: tuple[tuple[int, int], ...]
    tree: int | tuple = 0
    threads: int = 1
    processes: bool = False

    @classmethod
    def one(cls, shard: int, rows: tuple[int, int]) -> Group:
        return cls((shard,), (rows,))


@dataclass(frozen=True)
class Updates:
    """Replicated updates that a task applies to its worker's copy of the state first: the
    ``steps`` since that copy was kept, from their reduced partial sums (the task's last
    inputs: ``widths[j]`` of them for step ``j``, in turn); ``events``: send the last step's
    event."""

    opt: Optimizer
    steps: tuple[Step, ...]
    widths: tuple[int, ...]
    events: StepEvents | None = None


@dataclass(frozen=True)
class ForwardBackward:
    """``forward-backward-<step>-<shard>``: the summed gradient, loss and correct count of a
    group of shards' rows, ``[grad (P) | loss | correct]``.

    Inputs: the state, the group's shards in order, then (with ``updates``) the partial
    sums of the updates to apply first.  ``host``: the result leaves this worker.
    """

    net: Network
    shuffle_seed: int | None
    epoch: int
    group: Group
    host: bool
    updates: Updates | None = None


@dataclass(frozen=True)
class Reduce:
    """``reduce-<step>-<level>-<first>``: the sum of its inputs, in order."""

    host: bool


@dataclass(frozen=True)
class Update:
    """``update-<step>`` (the root's) or ``update-<step>-<first shard>`` (one worker's copy):
    the state after ``steps`` (one on the root; the steps since the state was kept on a
    replica), computed from the reduced gradients.

    Inputs: the state, then each step's partial sums in turn, ``widths[j]`` of them for
    step ``j`` (all the rest for the last; a window's last step may be reduced further than
    the others).  ``events``: send the last step's ``step`` event.
    """

    opt: Optimizer
    steps: tuple[Step, ...]
    host: bool
    events: StepEvents | None = None
    widths: tuple[int, ...] = ()


@dataclass(frozen=True)
class LocalSteps:
    """``local-sgd-<step>-<shard>``: each shard of ``group`` runs ``steps`` alone from the
    state; a group of several is summed as its reduce subtree would (``group.rows`` are
    unused: each step has its own).  Inputs: the state, the group's shards in order."""

    opt: Optimizer
    shuffle_seed: int | None
    steps: tuple[Step, ...]
    group: Group
    host: bool


@dataclass(frozen=True)
class Average:
    """``update-<step>`` of a local SGD round: the sample-weighted mean of the shards' local
    states; ``step`` stands for the round.  Inputs: the state, the tree's sums."""

    opt: Optimizer
    step: Step
    host: bool
    events: StepEvents | None = None


@dataclass(frozen=True)
class FullBatch:
    """``lbfgs-<first evaluation>``: a whole L-BFGS run (:func:`dtrain.maths.lbfgs.minimize`)
    on the worker holding every shard, each loss and gradient ``leaf``: every shard's rows
    summed as the reduce tree sums them.  ``l2``, ``samples``: the objective's; ``iterations``:
    scipy's ``maxiter``; ``shift``, ``scale`` (D,): the inputs' normalization, where ``gtol``
    is judged in the raw features' units (:func:`dtrain.maths.lbfgs.raw_units`).  Inputs:
    the starting state, the shards in order."""

    leaf: ForwardBackward
    optim: OptimConfig
    l2: float
    samples: int
    iterations: int
    shift: Any = None
    scale: Any = None


@dataclass(frozen=True)
class Evaluate:
    """``evaluate-<epoch>`` (``evaluate-test``: ``epoch`` is -1): loss and accuracy on a
    held-out shard.  Inputs: the state, the shard (None: no held-out data).  ``keep``: the
    result carries the state too (early stopping and ``keep_best`` choose among epochs)."""

    net: Network
    epoch: int
    keep: bool = False


# --- model parallelism (:mod:`dtrain.taskgraph.modelparallel`) ------------------------------

@dataclass(frozen=True)
class Spec:
    """The constants of one model-parallel run, shared by its task records."""

    net: Network
    slicing: Slicing
    opt: Optimizer
    shuffle_seed: int | None

    def dims(self, j: int, m: int) -> tuple[int, int, int]:
        u0, u1 = self.slicing.units(j)[m]
        return u1 - u0, self.net.layers[2 * j], self.net.layers[2 * j + 2]

    def minibatch(self, step: Step, shards: list[Shard]):
        """The whole global minibatch of ``step`` (every worker holds every shard)."""
        return minibatch(shards, step.epoch, step.bounds, self.shuffle_seed)


@dataclass(frozen=True)
class SliceForward:
    """``forward-<step>-<block>-<slice>``: the slice's partial pre-activation of the block's
    output.  Inputs: the slice's state, the block's input (None for block 0), the data."""

    spec: Spec
    step: Step
    block: int
    slice: int


@dataclass(frozen=True)
class Combine:
    """``combine-<step>-<block>``: a block's output activation.  Inputs: the root's state,
    then the partials."""

    spec: Spec
    block: int


@dataclass(frozen=True)
class Loss:
    """``loss-<step>``: the head, the loss and dL/dZ of the last block.  Inputs: the root's
    state, the data, then the partials."""

    spec: Spec
    step: Step


@dataclass(frozen=True)
class SliceBackward:
    """``backward-<step>-<block>-<slice>``: the slice's gradients, update and dA share.
    Inputs: the slice's state, the block's input (None for block 0), the signal, the
    data."""

    spec: Spec
    step: Step
    block: int
    slice: int


@dataclass(frozen=True)
class BackCombine:
    """``back-combine-<step>-<block>``: dL/dZ of block ``block``'s output.  Inputs: its
    activation, then the shares of dL/dA."""

    spec: Spec
    block: int


@dataclass(frozen=True)
class RootUpdate:
    """``update-<step>`` of model parallelism: the column biases and the head.  Inputs: the
    root's state, the last block's signal, then the earlier blocks' signals.  ``events``:
    send the step's event."""

    spec: Spec
    step: Step
    events: StepEvents | None = None


@dataclass(frozen=True)
class EvaluateSlices:
    """``evaluate-<epoch>`` of model parallelism.  Inputs: the root's state, the held-out
    shard, then every slice's last output."""

    spec: Spec
    epoch: int
    keep: bool = False
