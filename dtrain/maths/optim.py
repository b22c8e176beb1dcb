"""Optimizers over one flat state vector, the reduce operator, and LR schedules.

The training state is one buffer ``[params | optimizer slots | schedule]`` (SGD:
no slots, momentum: velocity, Adam: first and second moments; the ``adaptive``
schedule's three numbers, :data:`ADAPTIVE`, the other schedules none) plus the
running sums of the current epoch's training loss and correct predictions.
Every function is pure: it returns a new state and never writes into its inputs,
which Dask may share between tasks.

The ``adaptive`` schedule (scikit-learn's ``learning_rate="adaptive"``) is decided
inside the update, from the state alone, so it is the same on any number of
workers and whatever the driver's windows: the first step of each epoch reads
the epoch before it from the state's running sums, and divides the rate after
more than ``patience`` epochs without an improvement.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from dask.sizeof import sizeof

from dtrain.core.arrays import (OnItsWay, align_on_unpickle, array_module, like, on_gpu,
                                sum_in_order, to_host)
from dtrain.core.config import OptimConfig
from dtrain.core.errors import Diverged
from dtrain.maths.model import Layout, Network

SLOTS = {"sgd": 0, "momentum": 1, "adam": 2, "lbfgs": 0}   # lbfgs: its memory is scipy's
ROUND_TAIL = 3      # a local SGD leaf's buffer: [w * vector | loss sum | correct | w]
ADAPTIVE = 3        # the adaptive schedule's numbers after the slots: [scale | best | count]


def schedule_size(cfg: OptimConfig) -> int:
    """Numbers of the state vector after the optimizer slots: the adaptive schedule's
    ``[rate scale | best training loss | epochs without improvement]``, else none."""
    return ADAPTIVE if cfg.schedule == "adaptive" else 0


def state_size(cfg: OptimConfig, params: int) -> int:
    """Length of a state vector for ``params`` parameters: ``P (1 + slots) + schedule``."""
    return params * (1 + SLOTS[cfg.name]) + schedule_size(cfg)


@align_on_unpickle
@dataclass(frozen=True)
class TrainState:
    """What one step hands to the next.

    ``vector`` is ``[params (P) | slots (k*P)]``; ``epoch_loss``,
    ``epoch_samples`` and ``epoch_correct`` sum the training loss, the samples
    and the correct predictions over this epoch's steps so far (each step's
    predictions are made with the parameters before its update).
    """

    vector: Any
    epoch_loss: float = 0.0
    epoch_samples: int = 0
    epoch_correct: int = 0
    pending: Any = None     # on a GPU: (step, its [loss, correct] on the way to the host)
    _arrays = ("vector",)

    def with_vector(self, vector: Any) -> TrainState:
        """A state with ``vector`` and this state's epoch sums (a pending step's are kept
        pending: :func:`settle` adds them)."""
        return TrainState(vector, self.epoch_loss, self.epoch_samples, self.epoch_correct,
                          self.pending)

    def __getstate__(self) -> dict[str, Any]:
        if self.pending is not None:
            raise RuntimeError("a TrainState with a step's loss still on its way from the GPU "
                               "cannot leave its worker: settle it first")
        return self.__dict__


@dataclass(frozen=True)
class Step:
    """The driver's constants for one training step, baked into its tasks."""

    index: int                              # global step, from 0
    epoch: int                              # from 0
    position: int                           # step within its epoch, from 0
    lr: float
    count: int                              # samples in this global minibatch
    first: bool                             # first step of its epoch: restart the epoch sums
    last: bool                              # last step of its epoch: evaluate after it
    bounds: tuple[tuple[int, int], ...]     # rows lo:hi of each shard's epoch order

    def rowless(self) -> Step:
        """This step without its shards' rows: all an update reads.  ``bounds`` holds a
        pair per shard of the whole run, so a task that carries whole steps to every worker
        (replicated updates) would make each worker's share of a window grow with the
        number of shards."""
        return dataclasses.replace(self, bounds=())


@dataclass(frozen=True)
class Optimizer:
    """SGD, momentum or Adam over a flat parameter vector, with an L2 penalty on weights.

    ``net`` is a :class:`~dtrain.maths.model.Network`, or any layout with ``size``
    and ``weight_slices`` (a model-parallel slice).
    """

    cfg: OptimConfig
    net: Network | Layout
    l2: float = 0.0
    max_loss: float = math.inf          # train.max_loss: a larger mean step loss diverged
    raises: bool = True                 # False: a diverged step goes on (train.diverged =
                                        # "keep-best": the epoch's row says so, the driver ends)

    def check_loss(self, step: Step, loss: float, samples: int | float) -> None:
        """Raise :class:`~dtrain.core.errors.Diverged` if a step's summed ``loss`` over
        ``samples`` is NaN or infinite, or its mean per sample exceeds ``max_loss`` (unless
        ``raises`` is False)."""
        if not self.raises:
            return
        if not math.isfinite(loss):
            raise Diverged(step.index, step.epoch, loss)
        if samples and loss / samples > self.max_loss:
            raise Diverged(step.index, step.epoch, loss / samples, limit=self.max_loss)

    @property
    def slots(self) -> int:
        return SLOTS[self.cfg.name]

    def init_state(self, params) -> TrainState:
        xp = array_module(params)
        vector = xp.zeros(state_size(self.cfg, self.net.size), dtype=params.dtype)
        vector[: self.net.size] = params
        if self.cfg.schedule == "adaptive":
            vector[-ADAPTIVE:] = (1.0, math.inf, 0.0)     # full rate, no best yet, no count
        return TrainState(vector)

    def params(self, state: TrainState):
        return state.vector[: self.net.size]

    def apply(self, state: TrainState, grad, step: Step) -> TrainState:
        """Apply one update from the summed gradient buffer ``grad``
        (``[grad (P) | loss | correct]``)."""
        P = self.net.size
        return _add_to_epoch(state, step, self.step_vector(state, grad, step), float(grad[P]),
                             step.count, int(grad[P + 1]))

    def step_vector(self, state: TrainState, grad, step: Step) -> Any:
        """The vector ``[params | slots]`` after one update from ``grad``."""
        P, cfg = self.net.size, self.cfg
        xp = array_module(state.vector)
        g = self._gradient(grad[:P], state.vector[:P], 0, step.count)     # (P,)
        new = state.vector.copy()                          # (P * (1 + k) + schedule,)
        p = new[:P]
        lr = step.lr if cfg.schedule != "adaptive" else step.lr * self.adapt(state, new, step)
        if cfg.name == "sgd":
            p -= lr * g
        elif cfg.name == "momentum" and cfg.nesterov:      # scikit-learn's: v in step units
            v = new[P:2 * P]
            v *= cfg.momentum
            v -= lr * g                                    # v = mu v - lr g
            p += cfg.momentum * v - lr * g                 # the step looks ahead along v
        elif cfg.name == "momentum":
            v = new[P:2 * P]
            v *= cfg.momentum
            v += g
            p -= lr * v
        else:  # adam
            m, v = new[P:2 * P], new[2 * P:3 * P]
            m *= cfg.beta1
            m += (1 - cfg.beta1) * g
            v *= cfg.beta2
            v += (1 - cfg.beta2) * (g * g)
            t = step.index + 1
            m_hat = m / (1 - cfg.beta1 ** t)
            v_hat = v / (1 - cfg.beta2 ** t)
            p -= lr * m_hat / (xp.sqrt(v_hat) + cfg.eps)
        return new

    @property
    def by_segment(self) -> bool:
        """Whether an update can be applied a segment of the parameters at a time, each
        segment's new numbers the bytes the whole update gives them (:meth:`segment_step`):
        plain SGD, whose state has no slots and whose L2 penalty and rate are elementwise or
        one number for all."""
        return self.cfg.name == "sgd"

    def segment_step(self, state: TrainState, seg: Any, lo: int, step: Step) -> Any:
        """Numbers ``lo`` to ``lo + len(seg)`` of the step's buffer ``[params (P) | loss |
        correct]`` after the update, from the summed gradient's same numbers ``seg``: the
        parameters among them updated number for number as :meth:`step_vector` updates
        them, the loss and the correct count as they are.  Only where :attr:`by_segment`."""
        P = self.net.size
        out = seg.copy()                                   # (len(seg),)
        m = max(0, min(seg.shape[0], P - lo))              # parameters in the segment
        if not m:
            return out
        old = state.vector[lo:lo + m]
        lr = step.lr if self.cfg.schedule != "adaptive" \
            else step.lr * self._numbers(state, step)[0][0]
        with np.errstate(all="ignore"):        # as update's: a non-finite loss says it
            out[:m] = old - lr * self._gradient(seg[:m], old, lo, step.count)
        return out

    def _gradient(self, summed: Any, old: Any, lo: int, count: int) -> Any:
        """The mean gradient of parameters ``lo`` to ``lo + len(summed)`` from their summed
        gradient, plus the L2 penalty of the weights among them (``old``: their values)."""
        g = summed / count                                 # (m,) mean gradient
        if self.l2:
            for w in self.net.weight_slices:
                start, stop, _ = w.indices(self.net.size)
                a, b = max(start, lo), min(stop, lo + g.shape[0])
                if a < b:
                    g[a - lo:b - lo] += self.l2 * old[a - lo:b - lo]
        return g

    def adopt(self, state: TrainState, buf: Any, step: Step) -> TrainState:
        """The state after a step whose new parameters came whole in ``buf`` (``[params |
        loss | correct]``, made segment by segment by :meth:`segment_step`): the loss
        checked (:meth:`check_loss`), the adaptive schedule's numbers brought up to date,
        the step added to the epoch's sums.  Only where :attr:`by_segment`."""
        P = self.net.size
        loss, correct = (float(v) for v in to_host(buf[P:P + 2]))
        self.check_loss(step, loss, step.count)
        vector = buf[:P]                                   # (P,) a view: nothing writes it
        if self.cfg.schedule == "adaptive":
            numbers, _ = self._numbers(state, step)
            vector = array_module(buf).concatenate([vector, like(state.vector[P:], buf)])
            vector[-ADAPTIVE:] = numbers
        return _add_to_epoch(state, step, vector, loss, step.count, int(correct))

    def _numbers(self, state: TrainState, step: Step) -> tuple[tuple[float, float, float], bool]:
        """The adaptive schedule's ``(scale, best, count)`` for ``step`` from ``state``, and
        whether they changed (at an epoch's first step, see :meth:`adapt`)."""
        numbers = tuple(float(v) for v in state.vector[-ADAPTIVE:])
        if step.first and state.epoch_samples:
            return adapted(self.cfg, step.lr, numbers,
                           state.epoch_loss / state.epoch_samples), True
        return numbers, False

    def adapt(self, state: TrainState, new: Any, step: Step) -> float:
        """The adaptive schedule: the factor of ``step.lr`` for this step, its numbers in
        ``new``'s last :data:`ADAPTIVE` entries brought up to date (``new`` is this step's
        new vector).  At an epoch's first step, the epoch before it (its mean training
        loss, from ``state``'s running sums) counts as an improvement unless its loss is
        above the best less ``min_delta``; after more than ``patience`` epochs in a row
        without one, the factor is multiplied by ``gamma`` and the count restarts, or, if
        the rate is already at most ``min_lr``, it becomes 0: training stops, as
        scikit-learn's ``learning_rate="adaptive"`` stops."""
        numbers, changed = self._numbers(state, step)      # [scale, best, count]
        if changed:
            new[-ADAPTIVE:] = numbers
        return numbers[0]


def adapted(cfg: OptimConfig, lr: float, numbers: tuple[float, float, float],
            loss: float) -> tuple[float, float, float]:
    """The adaptive schedule's ``(scale, best, count)`` after an epoch of mean training loss
    ``loss`` at the base rate ``lr``, as scikit-learn decides: the epoch counts as no
    improvement unless its loss is below the best less ``min_delta``; after more than
    ``patience`` of them the scale is multiplied by ``gamma`` and the count restarts, or, if
    the rate is already at most ``min_lr``, the scale is 0 (training has stopped).  The
    update decides with it from the state (:meth:`Optimizer.adapt`), and the driver's
    :class:`~dtrain.training.stopping.Watch` from the epoch rows, the same numbers."""
    scale, best, count = numbers
    count = count + 1 if loss > best - cfg.min_delta else 0       # as scikit-learn
    best = min(best, loss)
    if count > cfg.patience:
        scale, count = (0.0 if lr * scale <= cfg.min_lr else scale * cfg.gamma), 0
    return scale, best, count


def _add_to_epoch(state: TrainState, step: Step, vector: Any, loss: float, samples: int,
                  correct: int) -> TrainState:
    """``vector`` with ``state``'s epoch sums plus one step's (restarted on an epoch's
    first step)."""
    if step.first:
        return TrainState(vector, loss, samples, correct)
    return TrainState(vector, state.epoch_loss + loss, state.epoch_samples + samples,
                      state.epoch_correct + correct)


def update(opt: Optimizer, step: Step, host: bool, state: TrainState, *grads) -> TrainState:
    """Reduce the incoming gradient buffers (in order) and apply one optimizer step, where
    the gradient is (GPU or host); the new state goes to host memory if ``host``.

    Raises :class:`~dtrain.core.errors.Diverged` if the step's loss (the slot after the
    gradient) is NaN or infinite, or above ``opt.max_loss`` per sample.  On a GPU, inside an
    epoch and a window, the loss is read one step late (:func:`settle`): reading it at once
    would make the host wait for the GPU every step, and the GPU for the host's next launches.
    """
    grad = sum_in_order(*grads)
    P = opt.net.size
    state = settle(opt, state).with_vector(like(state.vector, grad))
    lazy = on_gpu(grad) and not (host or step.last)
    if not lazy:
        loss, correct = (float(v) for v in to_host(grad[P:P + 2]))   # one read off a GPU
        opt.check_loss(step, loss, step.count)
    with np.errstate(all="ignore"):   # overflow shows up as a non-finite loss next step
        vector = opt.step_vector(state, grad, step)
    if lazy:
        return TrainState(vector, state.epoch_loss, state.epoch_samples, state.epoch_correct,
                          (step, OnItsWay(grad[P:P + 2])))
    new = _add_to_epoch(state, step, vector, loss, step.count, int(correct))
    return new.with_vector(to_host(new.vector)) if host else new


def settle(opt: Optimizer, state: TrainState) -> TrainState:
    """``state`` with its pending step's loss and correct count read off the GPU, checked
    (:meth:`Optimizer.check_loss`) and added to the epoch's sums (the state itself if none is
    pending)."""
    if state.pending is None:
        return state
    step, tail = state.pending
    loss, correct = (float(v) for v in tail.value())
    opt.check_loss(step, loss, step.count)
    return _add_to_epoch(state, step, state.vector, loss, step.count, int(correct))


def local_sgd(opt: Optimizer, steps: tuple[Step, ...], state: TrainState, batch,
              keys=None) -> Any:
    """Run ``steps`` on one shard alone, from ``state``; the local SGD leaf task.

    ``batch(step)`` gives the shard's rows of that step (and their sample weights, or
    None); ``keys(step)`` its dropout keys (:func:`~dtrain.maths.model.noise`), if any.
    Returns one buffer
    ``[w * vector | loss sum | correct | w]`` where ``w`` is the number of
    samples the shard saw and ``correct`` its correct predictions: the tree
    reduce sums these, and :func:`average` divides by the total weight, so the
    result is the sample-weighted mean of the local states.  With one step per
    round and SGD or momentum that is exactly the synchronous step, up to
    floating-point reassociation.
    """
    xp, P = array_module(state.vector), opt.net.size
    local, loss, correct, seen = TrainState(state.vector), 0.0, 0, 0
    for step in steps:
        x, y, *weights = batch(step)                             # and (B,) weights, if any
        if len(y) == 0:
            continue
        grad = opt.net.loss_and_grad(local.vector[:P], x, y, *weights,   # [grad | loss | correct]
                                     noise=None if keys is None else keys(step))
        opt.check_loss(step, float(grad[P]), len(y))
        with np.errstate(all="ignore"):
            local = opt.apply(local, grad, dataclasses.replace(step, count=len(y)))
        loss, correct, seen = loss + float(grad[P]), correct + int(grad[P + 1]), seen + len(y)
    out = xp.empty(local.vector.size + ROUND_TAIL, dtype=local.vector.dtype)  # (P(1+k) + 3,)
    out[:-ROUND_TAIL] = local.vector * seen
    out[-ROUND_TAIL:] = (loss, correct, seen)
    return out


def average(opt: Optimizer, step: Step, host: bool, state: TrainState,
            *buffers) -> TrainState:
    """Root of a local SGD round: the sample-weighted mean of the shards' local states."""
    total = sum_in_order(*buffers)
    loss = float(total[-3])
    correct, seen = int(total[-2]), float(total[-1])
    opt.check_loss(step, loss, seen)
    mean = total[:-ROUND_TAIL] / seen
    return _add_to_epoch(state, step, to_host(mean) if host else mean, loss, int(seen), correct)


def learning_rate(cfg: OptimConfig, epoch: int, epochs: int, samples: int = 0) -> float:
    """The learning rate for ``epoch`` (from 0) under ``cfg.schedule``; ``samples``: the
    training samples of an epoch (invscaling counts them, as scikit-learn's ``t_``).  The
    adaptive schedule starts from ``cfg.lr``; its factor lives in the state
    (:meth:`Optimizer.adapt`)."""
    if cfg.schedule == "step":
        return cfg.lr * cfg.gamma ** (epoch // cfg.decay_every)
    if cfg.schedule == "cosine":
        return 0.5 * cfg.lr * (1 + math.cos(math.pi * epoch / epochs))
    if cfg.schedule == "invscaling":
        return cfg.lr / (cfg.samples_seen + epoch * samples + 1) ** cfg.power_t
    return cfg.lr


@sizeof.register(TrainState)
def _sizeof_state(state: TrainState) -> int:
    return int(state.vector.nbytes) + 64
