from __future__ import annotations

import pickle
import re

import numpy as np
import pytest

from conftest import run_cli
from dtrain.core.arrays import sum_in_order
from dtrain.core.config import OptimConfig
from dtrain.core.errors import Diverged, exit_code
from dtrain.maths.model import Network
from dtrain.maths.optim import Optimizer, Step, TrainState, learning_rate, update
from dtrain.training.plan import Schedule

NET = Network((2, 2), "tanh", "cross-entropy", "float64")   # P = 6


def _step(index=0, count=2, lr=0.1, first=False):
    return Step(index, 0, index, lr, count, first, False, ())


def _grad(values, loss=1.0, correct=0):
    return np.array([*values, loss, correct], dtype=float)      # [grad | loss | correct]


def test_sgd_with_l2_penalty_on_weights_only():
    opt = Optimizer(OptimConfig(name="sgd"), NET, l2=0.5)
    p = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])               # W = p[:4], b = p[4:]
    new = opt.apply(opt.init_state(p), _grad([2.0] * 6), _step(count=2, lr=0.1))
    expected = p - 0.1 * (np.ones(6) + 0.5 * np.array([1, 2, 3, 4, 0, 0]))
    np.testing.assert_allclose(new.vector, expected, rtol=0, atol=1e-15)


def test_momentum_accumulates_velocity():
    opt = Optimizer(OptimConfig(name="momentum", momentum=0.9), NET)
    s = opt.init_state(np.zeros(6))
    g = _grad([1.0] * 6)
    s = opt.apply(s, g, _step(count=1, lr=0.1))
    s = opt.apply(s, g, _step(index=1, count=1, lr=0.1))
    np.testing.assert_allclose(opt.params(s), -0.1 * (1 + 1.9) * np.ones(6))
    np.testing.assert_allclose(s.vector[6:], 1.9 * np.ones(6))


def test_adam_matches_the_paper():
    cfg = OptimConfig(name="adam", beta1=0.9, beta2=0.999, eps=1e-8)
    opt = Optimizer(cfg, NET)
    s = opt.init_state(np.zeros(6))
    p, m, v = np.zeros(6), np.zeros(6), np.zeros(6)
    rng = np.random.default_rng(0)
    for t in range(1, 4):
        g = rng.standard_normal(6)
        s = opt.apply(s, _grad(g), _step(index=t - 1, count=1, lr=0.01))
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        p = p - 0.01 * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
    np.testing.assert_allclose(opt.params(s), p, rtol=1e-12)


def test_inputs_are_never_written():
    opt = Optimizer(OptimConfig(name="adam"), NET, l2=0.1)
    state = opt.init_state(np.ones(6))
    before = state.vector.copy()
    grad = _grad([1.0] * 6)
    grad.flags.writeable = False
    state.vector.flags.writeable = False
    opt.apply(state, grad, _step())
    assert (state.vector == before).all()


def test_epoch_loss_sums_restart_each_epoch():
    opt = Optimizer(OptimConfig(), NET)
    s = opt.init_state(np.zeros(6))
    s = opt.apply(s, _grad([0] * 6, loss=3.0, correct=1), _step(count=2, first=True))
    s = opt.apply(s, _grad([0] * 6, loss=1.0, correct=2), _step(count=2))
    assert (s.epoch_loss, s.epoch_samples, s.epoch_correct) == (4.0, 4, 3)
    s = opt.apply(s, _grad([0] * 6, loss=5.0, correct=2), _step(count=3, first=True))
    assert (s.epoch_loss, s.epoch_samples, s.epoch_correct) == (5.0, 3, 2)
    assert isinstance(s.epoch_correct, int)


def test_sum_in_order_is_a_left_fold():
    a, b, c = (np.array([1e16]), np.array([1.0]), np.array([-1e16]))
    assert sum_in_order(a, b, c)[0] == (1e16 + 1.0) - 1e16       # not a + (b + c)
    assert sum_in_order(a) is a


def test_update_reduces_then_steps():
    opt = Optimizer(OptimConfig(name="sgd"), NET)
    s = TrainState(np.zeros(6))
    out = update(opt, _step(count=4, lr=1.0), True, s, _grad([1.0] * 6), _grad([3.0] * 6))
    np.testing.assert_allclose(out.vector, -np.ones(6))


def test_update_checks_the_loss_slot_not_the_count():
    from dtrain.core.errors import Diverged
    opt = Optimizer(OptimConfig(name="sgd"), NET)
    s = TrainState(np.zeros(6), 1.0, 2, 1)
    with pytest.raises(Diverged):
        update(opt, _step(count=2), True, s, _grad([0.0] * 6, loss=np.inf, correct=2))
    out = update(opt, _step(count=2), True, s, _grad([0.0] * 6, loss=1.0, correct=2),
                 _grad([0.0] * 6, loss=0.5, correct=1))
    assert (out.epoch_loss, out.epoch_samples, out.epoch_correct) == (2.5, 4, 4)


@pytest.mark.parametrize("schedule, expected", [
    ("constant", [0.1, 0.1, 0.1, 0.1]),
    ("step", [0.1, 0.1, 0.05, 0.05]),
    ("cosine", [0.1, 0.5 * 0.1 * (1 + np.cos(np.pi / 4)), 0.05, 0.5 * 0.1 * (1 + np.cos(3 * np.pi / 4))]),
])
def test_learning_rate_schedules(schedule, expected):
    cfg = OptimConfig(lr=0.1, schedule=schedule, decay_every=2, gamma=0.5)
    assert [learning_rate(cfg, e, 4) for e in range(4)] == pytest.approx(expected)


def test_schedule_steps_cover_every_epoch():
    sch = Schedule([10, 10, 11], batch_size=8, cfg=OptimConfig(), epochs=3)
    assert sch.steps_per_epoch == 4 and len(sch) == 12
    steps = [sch[t] for t in range(len(sch))]
    assert [s.count for s in steps[:4]] == [8, 8, 8, 7]
    assert [s.first for s in steps[:5]] == [True, False, False, False, True]
    assert [s.last for s in steps[:4]] == [False, False, False, True]
    assert steps[5].epoch == 1 and steps[5].index == 5
    full = Schedule([10, 10], batch_size=10**9, cfg=OptimConfig(), epochs=2)
    assert full.steps_per_epoch == 1 and full[0].count == 20


@pytest.mark.parametrize("name", ["sgd", "momentum"])
def test_a_one_step_local_sgd_round_is_the_synchronous_step(name):
    """local_sgd on each shard + the sample-weighted average = one update from the summed
    gradient, for SGD and momentum (the trainer runs one-step rounds as that update)."""
    from dtrain.maths.optim import average, local_sgd
    net = Network((3, 4, 2), "tanh", "cross-entropy", "float64")
    opt = Optimizer(OptimConfig(name=name, momentum=0.9), net, l2=0.01)
    rng = np.random.default_rng(0)
    state = opt.init_state(net.init(0))
    state = opt.apply(state, _grad(rng.normal(size=net.size)), _step(count=1))   # velocity != 0
    shards = [(rng.normal(size=(n, 3)), rng.integers(0, 2, n)) for n in (5, 3, 4)]
    step = Step(1, 0, 1, 0.1, 12, False, False, ())
    leaves = [local_sgd(opt, (step,), state, lambda s, d=d: d) for d in shards]
    averaged = average(opt, step, True, state, *leaves)
    sync = update(opt, step, True, state, *(net.loss_and_grad(opt.params(state), x, y)
                                            for x, y in shards))
    np.testing.assert_allclose(averaged.vector, sync.vector, rtol=1e-12, atol=1e-14)
    assert averaged.epoch_samples == sync.epoch_samples == 1 + 12
    assert averaged.epoch_correct == sync.epoch_correct
    leaf = leaves[0]                                  # [w * vector | loss | correct | w]
    assert leaf.size == state.vector.size + 3 and leaf[-1] == 5 and 0 <= leaf[-2] <= 5


def test_checkpoints_keep_every_epoch_sum(tmp_path):
    """A resumed epoch goes on from the checkpoint's loss, sample and correct sums."""
    import dtrain
    from dtrain.training import checkpoint
    state = TrainState(np.arange(6.0), 2.5, 48, 31)
    checkpoint.save(tmp_path, checkpoint.Checkpoint(3, 0, state), dtrain.load_config())
    back = checkpoint.load(tmp_path)[0].state
    assert (back.epoch_loss, back.epoch_samples, back.epoch_correct) == (2.5, 48, 31)
    assert (back.vector == state.vector).all()


# --- scikit-learn's SGD: Nesterov's momentum and the schedules ---------------------------------

def _sklearn_sgd(lr: float, momentum: float, nesterov: bool, schedule: str = "constant"):
    from sklearn.neural_network._stochastic_optimizers import SGDOptimizer

    return SGDOptimizer([np.zeros(6)], lr, schedule, momentum, nesterov, 0.5)


@pytest.mark.parametrize("nesterov", [True, False])
def test_momentum_steps_as_scikit_learns_sgd(nesterov):
    """optim.nesterov: scikit-learn's Nesterov momentum, step for step, also while the rate
    changes (invscaling); without it, classical momentum, the same steps at a constant rate."""
    cfg = OptimConfig(name="momentum", momentum=0.9, nesterov=nesterov)
    opt, sk = Optimizer(cfg, NET), _sklearn_sgd(0.1, 0.9, nesterov)
    params, mine = [np.zeros(6)], opt.init_state(np.zeros(6))
    rng = np.random.default_rng(4)
    rates = [0.1, 0.1, 0.1] if not nesterov else [0.1, 0.05, 0.02, 0.02]
    for t, lr in enumerate(rates):
        g = rng.standard_normal(6)
        sk.learning_rate = lr
        sk.update_params(params, [g])
        mine = opt.apply(mine, _grad(g), _step(index=t, count=1, lr=lr))
        np.testing.assert_allclose(opt.params(mine), params[0], rtol=1e-12, atol=1e-15)


def test_nesterov_needs_momentum():
    import dtrain

    with pytest.raises(dtrain.UserError, match="optim.nesterov = true .* needs optim.name = "
                                               "'momentum'"):
        dtrain.load_config(None, ["optim.nesterov=true", "optim.name=adam"])
    assert dtrain.load_config().optim.nesterov is False       # classical: the locked bytes


def test_invscaling_is_scikit_learns_rate_per_epoch():
    """lr / (t + 1) ** power_t, t the samples seen before the epoch (samples_seen: before
    the run), as scikit-learn's iteration_ends sets it."""
    cfg = OptimConfig(lr=0.1, schedule="invscaling", power_t=0.5)
    sk = _sklearn_sgd(0.1, 0.9, True, "invscaling")
    rates = []
    for epoch in range(4):
        rates.append(sk.learning_rate)
        sk.iteration_ends((epoch + 1) * 150)
    assert [learning_rate(cfg, e, 4, 150) for e in range(4)] == pytest.approx(rates, rel=1e-15)
    assert rates[1] == pytest.approx(0.1 / 151 ** 0.5)
    later = OptimConfig(lr=0.1, schedule="invscaling", power_t=0.25, samples_seen=300)
    assert learning_rate(later, 0, 1, 150) == pytest.approx(0.1 / 301 ** 0.25)
    sch = Schedule([50, 50, 50], batch_size=30, cfg=cfg, epochs=3)
    assert [sch[t].lr for t in (0, 5, 10)] == pytest.approx(rates[:3])


def test_adaptive_divides_the_rate_as_scikit_learn():
    """The rate is decided inside the update at each epoch's first step, from the epoch
    before it (the state's running sums): after more than patience epochs without the
    training loss improving on the best by min_delta it falls by gamma, and is 0 once it
    would fall while at or below min_lr, where scikit-learn stops."""
    cfg = OptimConfig(name="sgd", lr=0.1, schedule="adaptive", patience=2, min_delta=1e-4,
                      gamma=0.2, min_lr=1e-3)
    opt, sk = Optimizer(cfg, NET), _sklearn_sgd(0.1, 0.0, False, "adaptive")
    losses = [1.0, 0.9, 0.95, 0.9, 0.89995, 0.92, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6,
              0.6, 0.6, 0.6, 0.6]
    state = opt.init_state(np.zeros(6))
    assert state.vector.size == 6 + 3 and list(state.vector[6:]) == [1.0, np.inf, 0.0]
    best, count, stopped = np.inf, 0, None
    for epoch, loss in enumerate(losses):              # scikit-learn's bookkeeping
        count = count + 1 if loss > best - 1e-4 else 0
        best = min(best, loss)
        if count > 2:
            if sk.learning_rate <= 1e-3:
                stopped = epoch
                break
            sk.learning_rate /= 5.0
            count = 0
        # dtrain: epoch `epoch` ends with this mean loss; the next epoch's first step decides
        state = TrainState(state.vector, loss * 4, 4, 0)
        state = opt.apply(state, _grad([0.0] * 6), Step(epoch + 1, epoch + 1, 0, 0.1, 4, True,
                                                        False, ()))
        assert 0.1 * state.vector[6] == pytest.approx(sk.learning_rate, rel=1e-12), epoch
    assert stopped is not None
    state = opt.apply(TrainState(state.vector, 0.6 * 4, 4, 0), _grad([1.0] * 6),
                      Step(99, 99, 0, 0.1, 4, True, False, ()))
    assert state.vector[6] == 0.0 and (opt.params(state) == 0).all()   # stopped: no step


def test_adaptive_needs_the_whole_steps_loss_in_one_update():
    import dtrain

    for sets in (["graph.strategy=local-sgd", "graph.sync_every=4"],
                 ["graph.strategy=model-parallel", "model.layers=[4, 8, 3]"]):
        with pytest.raises(dtrain.UserError, match="optim.schedule = 'adaptive'"):
            dtrain.load_config(None, ["optim.schedule=adaptive", *sets])
    dtrain.load_config(None, ["optim.schedule=adaptive", "graph.strategy=parameter-server"])


# --- a loss that explodes: train.max_loss -----------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["allreduce", "local-sgd", "model-parallel",
                                      "parameter-server", "serial"])
def test_an_exploding_loss_diverges_at_its_step(tmp_path, strategy):
    out = tmp_path / "run"
    proc = run_cli("--set", "optim.lr=1e6", "--set", f"graph.strategy={strategy}",
                   "--workers", "2", "--out", str(out), "--dashboard-address", "")
    assert proc.returncode == 3, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    # local SGD: each shard runs the round's steps alone and the first shard to explode says
    # so, which may be at step 1
    step = "[12]" if strategy == "local-sgd" else "2"
    assert re.fullmatch(r"dtrain: error: training diverged at step " + step +
                        r" \(epoch 1\): the mean loss per sample is [0-9.e+]+, above "
                        r"train\.max_loss = 1e\+06; lower optim\.lr or raise model\.l2", line), line
    assert not out.exists()          # nothing recorded: the run leaves no directory


def test_max_loss_is_a_bound_on_the_mean_loss_per_sample():
    opt = Optimizer(OptimConfig(name="sgd"), NET, max_loss=10.0)
    step = Step(index=4, epoch=1, position=0, lr=0.1, count=2, first=False, last=False,
                bounds=())
    state = TrainState(np.zeros(NET.size))
    grad = np.zeros(NET.size + 2)                               # (P + 2,)
    grad[NET.size] = 20.0                                       # 10 per sample: not above
    assert update(opt, step, True, state, grad).epoch_loss == 20.0
    grad[NET.size] = 20.5
    with pytest.raises(Diverged) as caught:
        update(opt, step, True, state, grad)
    exc = caught.value
    assert (exc.step, exc.epoch, exc.loss, exc.limit) == (4, 1, 10.25, 10.0)
    assert str(pickle.loads(pickle.dumps(exc))) == str(exc)     # as it comes from a worker
    assert exit_code(exc) == 3
    assert "the mean loss per sample is 10.25, above train.max_loss = 10" in str(exc)
    assert "the loss is nan" in str(Diverged(4, 1, float("nan")))


@pytest.mark.parametrize("schedule", ["constant", "adaptive"])
@pytest.mark.parametrize("l2", [0.0, 0.3])
def test_an_sgd_update_by_segments_is_the_whole_updates_bytes(schedule, l2):
    """Plain SGD's update made a segment at a time (as a described window makes it where each
    piece of the step's sum is added) and the pieces put together, then adopted, give the
    whole update's state number for number: L2 on weights only, the adaptive schedule's
    rate and numbers at an epoch's first step included; the loss tail travels untouched."""
    net = Network((5, 7, 3), "tanh", "cross-entropy", "float32")        # P = 66
    opt = Optimizer(OptimConfig(name="sgd", schedule=schedule), net, l2=l2)
    rng = np.random.default_rng(3)
    state = opt.init_state(rng.standard_normal(net.size).astype(np.float32))
    state = TrainState(state.vector, 2.5, 10, 4)           # an epoch behind it
    grad = np.concatenate([rng.standard_normal(net.size) * 10.0 ** rng.integers(-3, 3, net.size),
                           [7.25, 3.0]]).astype(np.float32)
    step = Step(12, 1, 0, 0.07, 6, True, False, ())
    whole = update(opt, step, False, state, grad)
    assert opt.by_segment
    for cuts in ([0, 68], [0, 1, 40, 66, 67, 68], [0, 17, 34, 51, 68]):
        made = np.concatenate([opt.segment_step(state, grad[a:b], a, step)
                               for a, b in zip(cuts, cuts[1:])])
        assert made[net.size:].tobytes() == grad[net.size:].tobytes()
        got = opt.adopt(state, made, step)
        assert got.vector.tobytes() == whole.vector.tobytes(), cuts
        assert (got.epoch_loss, got.epoch_samples, got.epoch_correct) == \
            (whole.epoch_loss, whole.epoch_samples, whole.epoch_correct)


def test_only_plain_sgd_updates_by_segments():
    """Momentum and Adam keep slots, whose segments would have to be gathered: their
    updates stay whole."""
    assert [Optimizer(OptimConfig(name=n), NET).by_segment
            for n in ("sgd", "momentum", "adam")] == [True, False, False]


def test_an_update_by_segments_checks_the_whole_steps_loss():
    opt = Optimizer(OptimConfig(name="sgd"), NET)
    made = opt.segment_step(opt.init_state(np.zeros(6)), _grad([1.0] * 6, loss=np.nan),
                            0, _step())
    with pytest.raises(Diverged):
        opt.adopt(opt.init_state(np.zeros(6)), made, _step())
