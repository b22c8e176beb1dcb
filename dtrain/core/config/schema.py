"""The schema: the seven sections of a run configuration, each a frozen dataclass.

Every field declares its rule next to its default and its doc string
(:mod:`dtrain.core.fields`), so the defaults, the checks of single keys, the error messages
and the configuration reference (``docs/_ext/configref.py`` reads :data:`SECTIONS`) are
one text.  Rules that span several keys are :mod:`dtrain.core.config.rules`.
"""
from __future__ import annotations

from dataclasses import dataclass

from dtrain.core import layerspec
from dtrain.core.fields import at_least, choice, free, opt, positive, unit_open
from dtrain.core.layerspec import LayerItem

# graph.strategy's values, in the order the docs list them.  Each is a strategy object of
# dtrain.taskgraph.strategies (a layer above, which names them in the same order:
# tests/test_config.py), and its rules on a config are in dtrain.core.config.rules, so what
# is valid is known here whatever has been imported.
STRATEGIES = ("allreduce", "parameter-server", "local-sgd", "model-parallel", "serial")

REBALANCE = ("auto", "never", "always")   # data.rebalance: partitions on the cluster, moved?
DATASETS = ("iris", "digits", "mnist", "image-folder", "csv", "parquet", "synthetic",
            "collection")       # collection: a Dask collection handed in from Python
VALUE_LOSSES = ("squared-error", "poisson")    # losses of real-valued targets (regression)
LABEL_LOSSES = ("binary-cross-entropy",)    # may also learn 0/1 label indicators (multilabel)
VALUE_DATASETS = ("csv", "parquet", "synthetic", "collection")    # datasets that can hold such targets


@dataclass(frozen=True)
class DataConfig:
    dataset: str = choice("iris", *DATASETS,
                          doc="iris and digits ship with scikit-learn; mnist reads IDX files, "
                          "image-folder a folder per class, csv and parquet files or globs "
                          "(read by the workers, partition by partition); synthetic is "
                          "generated; collection is a Dask collection given in Python")
    path: str = free("", "directory (mnist, image-folder), or a file or glob of files (csv, "
                     "parquet: e.g. /data/part-*.parquet)")
    label: str = free("", "csv, parquet: the label column's name ('': the last column); "
                      "csv regression: several target columns' names separated by commas")
    target: str = choice("auto", "auto", "class", "value",
                         doc="what a row's label is: a class, or real values (regression); "
                         "auto: value for model.loss = 'squared-error', else class")
    delimiter: str = opt("", "'' (detect) or one character, e.g. ';'",
                          lambda v: len(v) <= 1, "csv: the field separator")
    split: tuple[float, ...] = opt(
        (0.8, 0.1, 0.1), "three fractions (train, validation, test) >= 0 summing to 1",
        lambda v: len(v) == 3 and min(v) >= 0 and v[0] > 0 and abs(sum(v) - 1) < 1e-9,
        "the training, validation and test fractions of the rows, seeded by data.seed")
    normalize: str = choice("standardize", "standardize", "minmax", "none",
                            doc="input normalization, its statistics from the training "
                            "split only; part of the saved model")
    replicate: int = at_least(1, 1, "repeat the training set this many times")
    shards: int = at_least(4, 1, "fixed number of training shards")
    shuffle: bool = free(True, "reshuffle each shard every epoch")
    seed: int = at_least(0, 0, "seeds the split and every epoch's shuffle of each shard")
    samples: int = at_least(1000, 3, "synthetic: number of samples")
    features: int = at_least(20, 1, "synthetic: input dimension")
    classes: int = at_least(3, 2, "synthetic: number of classes")
    targets: int = at_least(1, 1, "synthetic regression: number of targets")
    image_size: tuple[int, ...] = opt(
        (), "[] (native size) or [height, width] of positive integers",
        lambda v: len(v) == 0 or (len(v) == 2 and min(v) >= 1),
        "image-folder (required, unless model.input_shape gives it), mnist: every image is "
        "resized to this size; empty with a convolutional net's model.input_shape: its "
        "height and width")
    grayscale: bool = free(True, "image-folder: convert images to one channel (else three, "
                           "each a (height, width) plane in turn); with model.input_shape "
                           "and no data.image_size: its channels decide")
    missing: str = choice("error", "error", "drop",
                          doc="a row with a missing (empty, NA, NaN) or infinite feature, or "
                          "without its label: error, one line naming its file, row and "
                          "column; drop, the row is left out (csv, parquet)")
    rebalance: str = choice("auto", *REBALANCE,
                            doc="partitions already on the cluster (Dask collections, "
                            "parquet and globbed csv): auto, move some once into a block of "
                            "consecutive partitions per worker only where the predicted "
                            "saving over the run's steps exceeds the move's cost; never, "
                            "each partition trains where it sits; always, move into blocks")


def _layers_fit(layers: tuple) -> bool:
    """At least two entries; sizes positive (the shapes are walked with input_shape by the
    rules across sections, :mod:`dtrain.core.config.rules`)."""
    return len(layers) >= 2 and all(v >= 1 for v in layers if isinstance(v, int))


@dataclass(frozen=True)
class ModelConfig:
    layers: tuple[LayerItem, ...] = opt(
        (4, 16, 3), layerspec.RULE, _layers_fit,
        "layer sizes: the input features first, the classes (or targets) last; checked "
        "against the data.  Convolutional nets also list layer tables ({conv = 6, kernel = "
        "5, stride = 1, padding = 2}, {pool = 'max', size = 2, stride = 2}, 'flatten', "
        "{dropout = 0.5}) and give model.input_shape")
    input_shape: tuple[int, ...] = opt(
        (), "[] or [channels, height, width] of positive integers",
        lambda v: len(v) == 0 or (len(v) == 3 and min(v) >= 1),
        "the images a convolutional net takes, (channels, height, width); each row of the "
        "data holds channels x height x width features in that order")
    activation: str = choice("tanh", "sigmoid", "tanh", "relu", "identity",
                             doc="the hidden layers' activation (identity: linear)")
    loss: str = choice("cross-entropy", "cross-entropy", "mse", "binary-cross-entropy",
                       "squared-error", "poisson",
                       doc="cross-entropy: softmax outputs; mse: sigmoid outputs against "
                       "one-hot classes; binary-cross-entropy: one logistic output for two "
                       "classes (model.layers[-1] = 1; the second class's probability), or "
                       "one per label with data.target = 'value' (0/1 label indicators: "
                       "multilabel); squared-error: identity outputs against real targets "
                       "(regression); poisson: exponential outputs against targets >= 0, half "
                       "the Poisson deviance (regression of counts and rates)")
    l2: float = at_least(0.0, 0.0, "L2 weight penalty (weights, not biases)")
    dtype: str = choice("auto", "auto", "float32", "float64",
                        doc="auto: float32 where the run uses GPUs, else float64")
    seed: int = at_least(0, 0, "seeds the initial parameters")
    init: str = choice("auto", "auto", "scikit-learn",
                       doc="the initial parameters: auto, Glorot-uniform (sigmoid, tanh) or "
                       "He-normal (relu) weights and zero biases; scikit-learn, as its MLPs "
                       "draw them (Glorot-uniform weights and biases, numpy's RandomState "
                       "seeded by model.seed)")
    init_from: str = free("", "a finished run directory: start from its parameters and its "
                          "input normalization, with a fresh optimizer (--init-from)")


@dataclass(frozen=True)
class OptimConfig:
    name: str = choice("sgd", "sgd", "momentum", "adam", "lbfgs",
                       doc="the optimizer; lbfgs: full-batch L-BFGS (scipy's L-BFGS-B on the "
                       "driver, each loss and gradient over the whole training set one task "
                       "graph), train.epochs its iterations")
    lr: float = positive(0.1, "the learning rate (the schedule's starting value)")
    momentum: float = unit_open(0.9, "momentum: the velocity's decay (classical momentum, or "
                                "Nesterov's with nesterov = true)")
    beta1: float = unit_open(0.9, "adam: decay of the first-moment estimate")
    beta2: float = unit_open(0.999, "adam: decay of the second-moment estimate")
    eps: float = positive(1e-8, "adam: added to the denominator's square root")
    nesterov: bool = free(False, "momentum: Nesterov's momentum, as scikit-learn computes it "
                          "(v = momentum v - lr g; params += momentum v - lr g)")
    schedule: str = choice("constant", "constant", "step", "cosine", "invscaling", "adaptive",
                           doc="the learning rate over the epochs: constant; step, times "
                           "gamma every decay_every epochs; cosine, from lr towards 0 over "
                           "train.epochs; invscaling, lr / (t + 1) ** power_t with t the "
                           "training samples seen before the epoch; adaptive, times gamma "
                           "after more than patience epochs in a row whose training loss is "
                           "not below the best by more than min_delta, then 0 once it would "
                           "fall while at or below min_lr (scikit-learn's learning_rate)")
    decay_every: int = at_least(10, 1, "step schedule: epochs between decays")
    gamma: float = opt(0.5, "in (0, 1]", lambda v: 0 < v <= 1,
                       "step, adaptive schedules: factor")
    power_t: float = at_least(0.5, 0.0, "invscaling schedule: exponent")
    samples_seen: int = at_least(0, 0, "invscaling schedule: training samples seen before "
                                 "this run (going on from another)")
    patience: int = at_least(10, 1, "adaptive schedule: the rate falls after more than this "
                             "many epochs in a row without an improvement of the training loss")
    min_delta: float = at_least(1e-4, 0.0, "adaptive schedule: the least decrease of the "
                                "training loss below its best that counts as an improvement")
    min_lr: float = at_least(1e-6, 0.0, "adaptive schedule: a rate that would fall while at or "
                             "below this is 0 instead: training has stopped")
    max_fun: int = at_least(15000, 1, "lbfgs: the most loss and gradient evaluations (scipy's "
                            "maxfun)")
    gtol: float = at_least(1e-4, 0.0, "lbfgs: converged once every component of the "
                           "gradient is at most this in magnitude (scipy's gtol), in the raw "
                           "features' units where the inputs are normalized")


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = at_least(10, 1, "passes over the training set")
    batch_size: int = at_least(16, 1, "global minibatch; >= training samples is full batch")
    patience: int = at_least(0, 0, "stop after this many epochs without an improvement of the "
                             "monitored loss by at least min_delta (0: never stop early)")
    min_delta: float = at_least(0.0, 0.0, "the least decrease of the monitored loss that "
                                "counts as an improvement")
    monitor: str = choice("val_loss", "val_loss", "train_loss", "val_score",
                          doc="what early stopping and keep_best watch: a loss (lower is "
                          "better), or val_score, the validation accuracy (a regression's R^2; "
                          "higher is better)")
    stopping: str = choice("dtrain", "dtrain", "scikit-learn",
                           doc="how an epoch counts as an improvement of the monitored value: "
                           "dtrain, better than the last epoch that improved by more than "
                           "min_delta; scikit-learn, better than the best so far by at least "
                           "min_delta (a slow steady descent stops), as scikit-learn's MLPs "
                           "count, and with optim.schedule = 'adaptive' the run ends where the "
                           "rate falls to 0")
    diverged: str = choice("error", "error", "keep-best",
                           doc="a step whose training loss is NaN, infinite or above max_loss: "
                           "error, the run stops there (exit code 3); keep-best (with "
                           "keep_best), the run ends after that epoch with the best epoch's "
                           "parameters, its row recording the diverged losses")
    keep_best: bool = free(False, "params.npz holds the parameters of the epoch with the best "
                           "monitored loss, not the last epoch's")
    max_loss: float = positive(1e6, "a step whose mean per-sample training loss exceeds this "
                               "has diverged, as a NaN or infinite loss has")


@dataclass(frozen=True)
class GraphConfig:
    strategy: str = choice("allreduce", *STRATEGIES,
                           doc="how the graph is built (dtrain.taskgraph.strategies)")
    fan_in: int = at_least(2, 2, "children per reduce task")
    sync_every: int = at_least(4, 1, "local-sgd: local steps between averagings")
    slices: int = at_least(2, 1, "model-parallel: slices each hidden layer is split into")
    window: int = at_least(0, 0, "steps per submitted graph; 0: about a second's worth, "
                           "100 to 1000 steps")
    fuse_update: bool = free(True, "apply the update inside the root reduce task")
    fuse_shards: str = choice("auto", "auto", "true", "false",
                              doc="one forward-backward task for the shards of a reduce "
                              "subtree that one worker holds, summed inside it (fewer tasks, "
                              "the same sums in the same order); auto: where the tasks it "
                              "saves cost more than a few percent of the step's compute "
                              "(dtrain.taskgraph.dataparallel.fuse_choice), else a task per shard")
    fuse_steps: bool = free(True, "a window runs as one task per worker, each step inside it "
                            "in order, the same bytes: on one worker (one node, one GPU, a "
                            "laptop) with no scheduler round trip per step "
                            "(dtrain.taskgraph.fuse); across workers, the values that cross "
                            "between them sent worker to worker (dtrain.taskgraph.span, "
                            "cluster.p2p); false shows every step in the task stream")
    reduce: str = choice("tree", "tree", "segments",
                         doc="in a window cut across workers (fuse_steps), how a step's sums "
                         "reach every worker with replicated updates: tree, summed up the "
                         "tree to its root, whose sum goes to every other worker (2 workers "
                         "exchange their sums); segments, a reduce-scatter and an allgather "
                         "(each of 3 to 16 workers sums a segment of every buffer over the "
                         "same tree and sends it to the others: the same bytes, 2 (W - 1) / W "
                         "buffers sent per worker, none more than another; dtrain.taskgraph."
                         "segments), for networks where a root's bytes cost more than "
                         "messages")
    update: str = choice("auto", "auto", "root", "replicated",
                         doc="where the optimizer step runs: on the reduce root, which sends "
                         "the new state to every worker, or on every worker from the reduced "
                         "gradient (allreduce only; one hop less per step); auto: for "
                         "allreduce, plain SGD's update made where the step's sum is made "
                         "(a segment a worker, the new parameters sent on), momentum's and "
                         "Adam's replicated")
    step_events: int = at_least(1, 0, "steps between live metrics events from the update "
                                "task to the scheduler (0: none)")
    step_event_gap: float = at_least(0.1, 0.0, "seconds: each worker sends step events at "
                                     "most this often (the run's last step always); 0: "
                                     "every step_events steps and each epoch's last")
    state_every: int = at_least(8, 1, "replicated updates: steps between the tasks that keep "
                                "each worker's state (fewer tasks per step; a lost worker "
                                "costs at most this many updates again)")


@dataclass(frozen=True)
class ClusterConfig:
    workers: int = at_least(0, 0, "worker processes (LocalCluster) or worker jobs (slurm, "
                            "pbs); 0: as cluster.layout says")
    threads_per_worker: int = at_least(0, 0, "Dask threads per worker; 0: as cluster.layout "
                                       "says")
    scheduler_address: str = free("", "use this running Dask scheduler instead")
    scheduler_file: str = free("", "use the running Dask scheduler whose address this JSON "
                               "file holds (dask scheduler --scheduler-file, dask-mpi, "
                               "dask-jobqueue), waiting up to cluster.timeout for it")
    dashboard_address: str = free("127.0.0.1:8787", "where the dashboard listens; without a "
                                  "host (':8787') on 127.0.0.1; '' disables it (the "
                                  "scheduler's /health and /metrics stay on 127.0.0.1)")
    device: str = choice("cpu", "cpu", "gpu", "auto",
                         doc="gpu: every shard on a GPU; auto: GPUs where workers have them")
    low_latency: bool = free(True, "send Dask's control messages without batching delays; "
                                   "wake workers' event loops less often")
    timeout: float = positive(10.0, "seconds to wait for a scheduler and its workers")
    layout: str = choice("hybrid", "hybrid", "flat",
                         doc="what cluster.workers = 0 and cluster.threads_per_worker = 0 "
                         "mean: hybrid, one worker process per machine (MPI: per node; "
                         "slurm, pbs: per job) with a thread per core; flat, a "
                         "single-thread worker process per core (MPI: per rank)")
    cores: str = choice("auto", "auto", "processes", "threads",
                        doc="how a worker computes the shards it holds in one task: on core "
                        "processes it starts once (one per extra thread, shared memory, no "
                        "GIL; Linux) or on its threads; auto: processes where the platform "
                        "has them (dtrain.taskgraph.cores)")
    kind: str = choice("local", "local", "slurm", "pbs",
                       doc="who starts the workers: a LocalCluster, or dask-jobqueue batch jobs")
    tls: str = choice("auto", "auto", "on", "off",
                      doc="TLS with a certificate made for the run, on every cluster dtrain starts "
                      "(auto, on); off: plain TCP, which other users of the machine can use")
    interface: str = free("", "network interface for the scheduler and workers, e.g. 'ib0'; "
                          "'': 127.0.0.1 for a LocalCluster, every interface under MPI and "
                          "for batch jobs")
    jobqueue_file: str = free("", "dask-jobqueue YAML ('' = the jobqueue.yaml shipped with dtrain)")
    p2p: str = choice("auto", "auto", "mesh", "tcp", "mpi",
                      doc="how the tasks of a window that spans workers send each other a "
                      "step's values (dtrain.deploy.p2p): auto and mesh, a Unix socket "
                      "between workers on one machine and TCP between machines (with the "
                      "cluster's TLS); tcp, TCP between any two workers (what crossing "
                      "machines costs, on one); mpi, MPI point-to-point where the workers are "
                      "ranks of dtrain's own MPI job (--scheduler-rank; else an error): for "
                      "a fabric where MPI outruns TCP (on one machine the mesh measured "
                      "faster)")


@dataclass(frozen=True)
class TrackConfig:
    tensorboard: bool = free(False, "write TensorBoard event files to <run dir>/tensorboard/ "
                             "(pip install 'dtrain[tensorboard]')")
    mlflow: bool = free(False, "log to MLflow (pip install 'dtrain[mlflow]')")
    mlflow_uri: str = opt("mlruns", "a tracking URI (file:, sqlite:, http:, ...) or a "
                           "directory", lambda v: bool(v.strip()),
                           "where MLflow logs; a directory or relative file: URI is made an "
                           "absolute file: URI (a local file store) at load time")
    experiment: str = opt("dtrain", "a non-empty name", lambda v: bool(v.strip()),
                           "the MLflow experiment the run is logged under")


SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "model": ModelConfig,
    "optim": OptimConfig,
    "train": TrainConfig,
    "graph": GraphConfig,
    "cluster": ClusterConfig,
    "track": TrackConfig,
}
