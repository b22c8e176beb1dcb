"""Deployment without mpiexec: [cluster] keys, TLS on a LocalCluster, rank and GPU rules."""
from __future__ import annotations

import os
import sys

import pytest
from distributed import Client, Security

import dtrain
from conftest import run_cli
from dtrain.cli.train import prepare
from dtrain.core.config import ClusterConfig, ConfigError
from dtrain.core.errors import UserError
from dtrain.deploy import layout, mpi, rankgpus
from dtrain.deploy.connect import connect
from dtrain.deploy.options import security_for


@pytest.mark.parametrize("sets, message", [
    (["cluster.tls=maybe"], "cluster.tls = 'maybe'"),
    (["cluster.kind=lsf"], "cluster.kind = 'lsf'"),
    (["cluster.kind=slurm", "cluster.scheduler_address=tcp://x:1"],
     r"cluster.kind = 'slurm' in .* starts its own scheduler"),
    (["cluster.tls=on", "cluster.scheduler_address=tcp://x:1"],
     "takes its TLS files from the Dask config"),
])
def test_cluster_keys_are_checked(sets, message):
    with pytest.raises(ConfigError, match=message):
        dtrain.load_config({}, sets)


def test_jobqueue_file_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = dtrain.load_config(None, ["cluster.jobqueue_file=site.yaml"])
    assert cfg.cluster.jobqueue_file == str(tmp_path / "site.yaml")


@pytest.mark.parametrize("tls, wanted", [("auto", True), ("on", True), ("off", False)])
def test_tls_is_on_by_default_on_every_cluster_dtrain_starts(tls, wanted):
    security = security_for(ClusterConfig(tls=tls))
    assert isinstance(security, Security) == wanted
    if wanted:      # in memory: a certificate and key made for the run, not file names
        assert security.require_encryption and "BEGIN CERTIFICATE" in security.tls_ca_file
        assert "PRIVATE KEY" in security.tls_scheduler_key
        assert security.tls_ca_file != security_for(ClusterConfig(tls=tls)).tls_ca_file


def test_the_run_credentials_are_an_ec_key_and_can_be_made_ahead():
    """One set of credentials per run: made ahead (while the run plans) and taken once; an
    elliptic-curve key (cheaper to make and to sign with than Dask's RSA one)."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

    from dtrain.deploy import options

    cfg = ClusterConfig()
    options.make_ahead(cfg)
    options.make_ahead(cfg)                 # one at most
    assert len(options._ahead) == 1
    ahead = options._ahead[0].result(timeout=30)
    assert security_for(cfg) is ahead and options._ahead == []
    again = security_for(cfg)               # made now, and another
    assert again.tls_ca_file != ahead.tls_ca_file
    cert = x509.load_pem_x509_certificate(again.tls_worker_cert.encode())
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    options.make_ahead(ClusterConfig(tls="off"))
    assert options._ahead == []


def test_the_default_local_cluster_is_on_tls_and_writes_no_key(tmp_path, monkeypatch):
    """The embedded cluster's scheduler and workers are on TLS (the run's certificate); the
    key never lies in a file, but for the moment distributed loads it into an SSL context, in
    a folder only the user can open, removed at once: TMPDIR holds nothing after."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    cfg = dtrain.load_config(None, ["cluster.workers=1", "cluster.dashboard_address="])
    with connect(cfg.cluster) as client:
        assert client.scheduler.address.startswith("tls://127.0.0.1:")
        assert all(w.startswith("tls://127.0.0.1:") for w in client.scheduler_info()["workers"])
        with pytest.raises(OSError):
            Client(client.scheduler.address.replace("tls://", "tcp://"), timeout=3)
    assert [p for p in tmp_path.rglob("*") if p.suffix in (".pem", ".crt", ".key")] == []


def test_local_cluster_over_tls_trains_and_refuses_other_certificates():
    cfg = dtrain.load_config(None, ["cluster.tls=on", "train.epochs=2",
                                    "cluster.dashboard_address="])
    with connect(cfg.cluster) as client:
        address = client.scheduler.address
        assert address.startswith("tls://127.0.0.1:")
        result = dtrain.train(cfg, client=client, echo=None)
        with pytest.raises(OSError):
            Client(address, security=Security.temporary(), timeout=3)
    # the default (hybrid) layout: one worker process, a thread per core (at most a shard each)
    assert result.summary["workers"] == 1 and result.summary["test_accuracy"] is not None
    assert result.summary["threads"] == min(layout.machine_cores(), 4)


def test_command_line_mistakes_are_one_line(tmp_path):
    proc = run_cli("--bogus", "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "dtrain: error: unrecognized arguments: --bogus (see python -m dtrain --help)"]


@pytest.mark.parametrize("strategy, ranks", [("serial", 1), ("allreduce", 2),
                                             ("parameter-server", 3)])
def test_ranks_needed(strategy, ranks):
    job = prepare(["--set", f"graph.strategy={strategy}"])     # what the MPI head runs
    mpi.check_ranks(job, ranks)
    with pytest.raises(UserError, match=f"needs {ranks} MPI ranks .* found {ranks - 1}; "
                                        f"start it with mpirun -n {ranks} or more"):
        mpi.check_ranks(job, ranks - 1)


def test_gpus_are_dealt_round_robin_to_the_worker_ranks_of_a_node(monkeypatch):
    assert [rankgpus.gpu_for(i, ["0", "1", "2"]) for i in range(5)] == ["0", "1", "2", "0", "1"]
    assert rankgpus.gpu_for(0, []) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert rankgpus.visible_gpus() == ["3", "5"]
    assert rankgpus.pin_gpu("cpu", 1) is None
    assert rankgpus.pin_gpu("gpu", 1) == "5"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"     # monkeypatch restores it


# --- cluster.layout: what workers = 0 and threads_per_worker = 0 mean ------------------------

def _cluster(*sets: str) -> ClusterConfig:
    return dtrain.load_config({}, list(sets)).cluster


@pytest.mark.parametrize("sets, min_workers, leaves, shape", [
    ((), 1, 0, (1, 16)),                                       # hybrid: one process, 16 threads
    ((), 1, 4, (1, 4)),                                        # no more threads than shards
    ((), 2, 64, (2, 8)),                                       # a parameter server: 2 workers
    (("cluster.workers=4",), 1, 64, (4, 4)),                   # explicit processes share cores
    (("cluster.threads_per_worker=3",), 1, 2, (1, 3)),         # explicit threads are kept
    (("cluster.layout=flat",), 1, 0, (16, 1)),                 # flat: a process per core
    (("cluster.layout=flat",), 1, 4, (4, 1)),                  # ... at most one per shard
    (("cluster.layout=flat",), 2, 1, (2, 1)),
    (("cluster.layout=flat", "cluster.workers=3", "cluster.threads_per_worker=2"), 1, 8, (3, 2)),
])
def test_local_shape_follows_the_layout_unless_told(sets, min_workers, leaves, shape):
    got = layout.local_shape(_cluster(*sets), min_workers, leaves, cores=16)
    assert (got.workers, got.threads) == shape


@pytest.mark.parametrize("sets, min_workers, leaves, jobs, shape", [
    ((), 1, 64, 1, (1, 16)),                                   # hybrid: a worker per job
    ((), 2, 64, 2, (1, 16)),
    (("cluster.workers=3",), 1, 6, 3, (1, 2)),                 # 6 shards over 3 jobs
    (("cluster.layout=flat",), 1, 64, 1, (16, 1)),             # flat: a worker per core
    (("cluster.layout=flat", "cluster.threads_per_worker=4"), 1, 64, 1, (4, 4)),
])
def test_batch_jobs_follow_the_layout(sets, min_workers, leaves, jobs, shape):
    count, got = layout.job_shape(_cluster(*sets), 16, min_workers, leaves)
    assert (count, got.workers, got.threads) == (jobs, *shape)


def _places(*nodes: int, gpu: tuple[int, ...] = (), cores: int = 4) -> list[layout.RankPlace]:
    """Worker ranks 1, 2, ... on nodes of ``cores`` cores: ``nodes`` gives each rank's node."""
    out = []
    for rank, node in enumerate(nodes, start=1):
        first = min(r for r, n in enumerate(nodes, start=1) if n == node)
        cpus = frozenset(range(node * cores, (node + 1) * cores))
        out.append(layout.RankPlace(rank, f"node{node}", first, cpus, rank in gpu))
    return out


def test_mpi_hybrid_makes_one_worker_rank_per_node_with_its_cores():
    places = _places(0, 0, 1, 1, 1)                 # ranks 1-2 on node 0, 3-5 on node 1
    roles = layout.assign(places, _cluster(), leaves=64)
    assert {r: role.threads for r, role in roles.items()} == {1: 4, 2: 0, 3: 4, 4: 0, 5: 0}
    assert roles[3].cpus == frozenset(range(4, 8))   # the node's cores, left to it
    line = layout.describe(roles, places, "hybrid")
    assert line.startswith("layout: hybrid, 2 Dask worker(s) on 2 node(s) (rank(s) 1, 3), "
                           "4 thread(s) each; rank(s) 2, 4-5 start no worker")
    # a strategy that needs more workers than nodes: more ranks serve, sharing their cores
    roles = layout.assign(places[:2], _cluster(), min_workers=2, leaves=64)
    assert {r: role.threads for r, role in roles.items()} == {1: 2, 2: 2}
    assert not roles[1].cpus
    # no more threads than shards; explicit threads; flat: every rank, one thread
    assert layout.assign(places, _cluster(), leaves=2)[1].threads == 1
    assert {role.threads for role in layout.assign(
        places, _cluster("cluster.threads_per_worker=3")).values()} == {0, 3}
    assert {role.threads for role in layout.assign(
        places, _cluster("cluster.layout=flat")).values()} == {1}


def test_mpi_flat_ranks_that_outnumber_their_cores_share_them_in_neighbour_blocks():
    """Flat one-thread worker ranks: as started while each has a core; more ranks than a
    node's cores are pinned a core each, consecutive ranks (the sum's first pairs)
    together; GPU ranks and workers of more threads are left alone."""
    flat = _cluster("cluster.layout=flat")
    roles = layout.assign(_places(0, 0, 0, 0, cores=4), flat)
    assert {role.cpus for role in roles.values()} == {frozenset()}
    places = _places(0, 0, 0, 0, 1, 1, 1, 1, 1, cores=2)    # node 1: cores 2-3
    roles = layout.assign(places, flat)
    assert {r: sorted(role.cpus) for r, role in roles.items()} == {
        1: [0], 2: [0], 3: [1], 4: [1], 5: [2], 6: [2], 7: [2], 8: [3], 9: [3]}
    assert {role.threads for role in roles.values()} == {1}
    assert all(role.shared for role in roles.values())      # its reads do not poll first
    line = layout.describe(roles, places, "flat")
    assert line.endswith("; more worker ranks than cores: pinned 9 rank(s) to 4 core(s), "
                         "neighbours together")
    assert "pinned" not in layout.describe(layout.assign(_places(0, 0), flat),
                                           _places(0, 0), "flat")
    gpu = layout.assign(_places(0, 0, 0, gpu=(1,), cores=1), flat)
    assert [sorted(gpu[r].cpus) for r in (1, 2, 3)] == [[], [0], [0]]
    wide = layout.assign(places, _cluster("cluster.layout=flat",
                                          "cluster.threads_per_worker=2"))
    assert {role.cpus for role in wide.values()} == {frozenset()}


def _affinity() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def _every_thread_on(cores: list[int]) -> bool:
    return all(sorted(os.sched_getaffinity(int(t))) == cores for t in os.listdir("/proc/self/task"))


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_an_embedded_clusters_workers_that_outnumber_the_cores_are_pinned_like_mpi_ranks():
    """Twice as many one-thread workers as the driver's cores (two of this machine's): worker
    ``i`` and every thread it has on one core, neighbours together; as many workers as
    cores: left alone."""
    before = os.sched_getaffinity(0)
    cores = sorted(before)[:2]
    os.sched_setaffinity(0, cores)             # the driver's cores, which the workers inherit
    try:
        cfg = dtrain.load_config(None, [f"cluster.workers={2 * len(cores)}",
                                        "cluster.threads_per_worker=1"]).cluster
        with connect(cfg) as client:
            got = client.run(_affinity)
            names = {w["name"]: a for a, w in client.scheduler_info()["workers"].items()}
            assert [got[names[i]] for i in range(2 * len(cores))] == \
                [[c] for c in cores for _ in range(2)]
            assert all(client.run(_every_thread_on, [cores[0]], workers=[names[0]]).values())
        cfg = dtrain.load_config(None, [f"cluster.workers={len(cores)}",
                                        "cluster.threads_per_worker=1"]).cluster
        with connect(cfg) as client:        # (as the process that started them: a superset)
            assert all(set(cores) <= set(a) for a in client.run(_affinity).values())
    finally:
        os.sched_setaffinity(0, before)


def test_mpi_gpu_ranks_keep_one_worker_each():
    places = _places(0, 0, 0, gpu=(1, 2))           # two GPU ranks and a CPU rank on a node
    roles = layout.assign(places, _cluster(), leaves=64)
    assert {r: role.threads for r, role in roles.items()} == {1: 1, 2: 1, 3: 4}


def _heartbeat_cut_shows() -> bool:
    """On a worker: would its log show a heartbeat cut by the scheduler's close?"""
    import logging

    log = logging.getLogger("distributed.worker")
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0,
                            "Failed to communicate with scheduler during heartbeat.", (), None)
    return all(f.filter(record) for f in log.filters)


def test_an_embedded_clusters_workers_keep_its_close_off_the_console():
    """A run stopped by SIGUSR1 closed its LocalCluster while a worker's heartbeat was in
    flight, and the worker printed the cut comm with a traceback (32 lines instead of 2).
    The workers of a cluster dtrain starts drop those errors once it is closing, and only
    then: the same error mid-run still shows."""
    from dtrain.deploy.logs import mark_closing

    cfg = dtrain.load_config(None, ["cluster.workers=1", "cluster.threads_per_worker=1"]).cluster
    with connect(cfg) as client:
        assert list(client.run(_heartbeat_cut_shows).values()) == [True]
        client.run(mark_closing)
        assert list(client.run(_heartbeat_cut_shows).values()) == [False]


def test_a_run_says_nothing_of_a_call_that_found_a_worker_gone():
    """While a run goes on, the scheduler in this process drops its error for a call on
    every worker that found one gone (dtrain leaves that worker out and says so once);
    another broadcast error, or one outside a run, still shows."""
    import logging

    from dtrain.deploy.logs import lost_gathers_quiet

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("distributed.scheduler", logging.ERROR, __file__, 1, msg,
                                 (), None)

    gone = record("broadcast to tcp://127.0.0.1:1 failed: CommClosedError: in <TCP (closed) "
                  "Scheduler Broadcast local=tcp://127.0.0.1:2 remote=tcp://127.0.0.1:1>: "
                  "Stream is closed")
    other = record("broadcast to tcp://127.0.0.1:1 failed: ValueError: a bug")
    log = logging.getLogger("distributed.scheduler")
    with lost_gathers_quiet():
        assert not log.filter(gone) and log.filter(other)
    assert log.filter(gone)


def test_a_run_says_nothing_of_values_it_could_not_gather_from_a_dying_worker():
    """While a run goes on, the scheduler's gather from a worker that is being killed, which
    tornado answers with "IOStream is not idle" on TLS where distributed expects an OSError,
    is not printed with its traceback (the values are computed again; the run says so once);
    another error while gathering (a value that does not deserialize) still shows."""
    import logging

    from dtrain.deploy.logs import lost_gathers_quiet

    def record(exc: BaseException) -> logging.LogRecord:
        return logging.LogRecord("distributed.utils_comm", logging.ERROR, __file__, 1,
                                 "Unexpected error while collecting tasks %s from %s",
                                 (["kept-63-r"], "tls://127.0.0.1:1"),
                                 (type(exc), exc, None))

    cut = record(ValueError("IOStream is not idle; cannot convert to SSL"))
    other = record(ValueError("could not deserialize"))
    log = logging.getLogger("distributed.utils_comm")
    with lost_gathers_quiet():
        assert not log.filter(cut) and log.filter(other)
    assert log.filter(cut)


# --- what a worker imports --------------------------------------------------------------------

def test_the_default_jobs_workers_import_no_bokeh_and_no_scikit_learn(tmp_path):
    """Most of the default job's fixed cost was its workers importing the whole package
    (the reports, Bokeh) to run a task, and scikit-learn to read iris: now a task imports
    the part it runs, and iris is read from scikit-learn's file without importing it."""
    from distributed import Client, LocalCluster
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True,
                      dashboard_address=None) as lc, Client(lc) as c:
        dtrain.train(dtrain.load_config(None, ["train.epochs=1"]), client=c, echo=None,
                     out=tmp_path / "run")
        loaded = c.run(lambda: sorted(m for m in ("bokeh", "sklearn", "dtrain.training",
                                                  "dtrain.observe.htmlreport")
                                      if m in sys.modules))
    assert list(loaded.values()) == [[]], loaded
