"""Training data that is a Dask collection: its partitions stay where they are.

:func:`from_arrays`, :func:`from_frame` and :func:`from_files` make a
:class:`Collection`: every partition computed (or already held) on the
cluster, one future each, in partition order, where the scheduler put it (the
engine then moves some once, into blocks of consecutive partitions per worker, where that
pays: :func:`dtrain.taskgraph.placement.rebalance`).  Files are read by the workers
each in a block of its own, as the engine wants them, so that none has to move.
Nothing is gathered to the driver or concatenated anywhere; unknown chunk sizes are learnt once, by
:func:`describe`, which runs :func:`dtrain.data.partitions.part_stats` on each
partition's worker and merges the results in a tree of fixed fan-in and order.
"""
from __future__ import annotations

import glob
import math
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import dask
from dask.task_spec import Task, TaskRef
from distributed import Client, Future, wait

from dtrain.core import keys
from dtrain.core.config import DataConfig
from dtrain.core.errors import DataError
from dtrain.data import partitions, tables
from dtrain.data.partitions import Columns, PartSpec, PartStats
from dtrain.deploy.workers import worker_addresses
from dtrain.taskgraph.placement import row_blocks


@dataclass
class Collection:
    """A collection's partitions on the cluster: ``futures[i]`` holds partition ``i`` (a
    pandas DataFrame, or an ``(x, y)`` pair of array blocks), read as ``columns`` says."""

    futures: list[Future]
    columns: Columns
    features: int
    names: tuple[str, ...] | None = None
    targets: tuple[str, ...] = ("y",)             # a regression's target names
    stats: PartStats | None = None                # once described
    parts: list[PartStats] = field(default_factory=list)   # each partition's, in order
    classes: tuple[Any, ...] | None = None        # the labels to learn (None: the data's own)
    files: tuple[str, ...] = ()                   # partition i is files[i], where known
    first_line: int | None = None                 # a CSV file's line of its first data row

    @property
    def keys(self) -> list[Any]:
        return [f.key for f in self.futures]

    def holders(self, client: Client) -> list[str | None]:
        """The worker holding each partition now (the first, by address, if several)."""
        where = client.who_has(self.futures)
        return [min(where.get(k) or [None], key=str) for k in self.keys]

    def nbytes(self, client: Client) -> list[int]:
        sizes = client.nbytes(keys=self.keys, summary=False)
        return [int(sizes.get(k, 0)) for k in self.keys]


# --- making one -------------------------------------------------------------------------------

def check_numeric(dtypes: dict[Any, Any], features: list[Any], where: str) -> None:
    """A :class:`DataError` naming the feature columns that are not numbers (or booleans)."""
    import pandas as pd

    bad = [c for c in features if not (pd.api.types.is_numeric_dtype(dtypes[c])
                                       or pd.api.types.is_bool_dtype(dtypes[c]))]
    if bad:
        raise DataError(f"feature column{'s' if len(bad) > 1 else ''} "
                        f"{', '.join(map(repr, bad))} of {where} {'are' if len(bad) > 1 else 'is'} "
                        f"not numeric ({', '.join(str(dtypes[c]) for c in bad)}); encode or drop "
                        f"{'them' if len(bad) > 1 else 'it'} before training")


WEIGHT = "__sample_weight__"      # a frame's sample-weight column, where weights are given


def from_frame(client: Client, frame: Any, label: str | Any, where: str = "the dataframe",
               weight: Any = None, in_blocks: bool = False) -> Collection:
    """A dask.dataframe (features and, by name, the label column; or ``label`` a Series of
    the same partitions) as a :class:`Collection`; ``weight``, a Series of the same
    partitions, its rows' sample weights.  ``in_blocks``: a frame whose partitions depend
    on nothing already on the cluster (files to read) is computed in blocks of
    consecutive partitions per worker (:func:`_in_blocks`)."""
    if not isinstance(label, str):
        name = label.name if label.name is not None and label.name not in frame.columns \
            else "__label__"
        frame = frame.assign(**{name: label})
        label = name
    if label not in frame.columns:
        raise DataError(f"the label column {label!r} is not a column of {where}; its columns "
                        f"are {', '.join(map(str, frame.columns))}")
    if weight is not None:
        frame = frame.assign(**{WEIGHT: weight})
    features = [c for c in frame.columns if c not in (label, WEIGHT)]   # as the frame names them
    check_numeric(frame.dtypes.to_dict(), features, where)
    parts = list(frame.to_delayed())
    futures = _in_blocks(client, parts) if in_blocks else client.compute(parts)
    return Collection(futures, Columns(tuple(features), label,
                                       None if weight is None else WEIGHT),
                      len(features), tuple(map(str, features)), (str(label),))


def from_arrays(client: Client, x: Any, y: Any, w: Any = None) -> Collection:
    """Dask arrays ``x`` (rows, features) and ``y`` (rows,) as a :class:`Collection`: one
    partition per block of rows of ``x`` (``y`` is cut the same way; so are the sample
    weights ``w`` (rows,), if given: a partition is then ``(x, y, w)`` blocks)."""
    if x.ndim != 2:
        raise DataError(f"X must be 2-d (rows, features), got {x.ndim}-d")
    x = x.rechunk({1: -1})
    unknown = any(c != c for c in (*x.chunks[0], *y.chunks[0]))     # NaN: not known yet
    if not (unknown and len(x.chunks[0]) == len(y.chunks[0])):     # else: blocks pair up
        if unknown:                                # learnt once, from the data in memory
            x, y = client.persist([x, y])
            x, y = x.compute_chunk_sizes(), y.compute_chunk_sizes()
        if x.shape[0] != y.shape[0]:
            raise DataError(f"X has {x.shape[0]} rows but y has {y.shape[0]}; pass one label "
                            f"per row")
        y = y.rechunk({0: x.chunks[0]})
    if y.ndim == 2:                                # several targets: one block of columns
        y = y.rechunk({1: -1})
    blocks = [x.to_delayed().ravel(), y.to_delayed()[..., 0].ravel() if y.ndim == 2
              else y.to_delayed().ravel()]
    if w is not None:
        blocks.append(w.rechunk({0: x.chunks[0]}).to_delayed().ravel())
    pairs = [dask.delayed(_pair, pure=True)(*b) for b in zip(*blocks)]
    targets = ("y",) if y.ndim == 1 else tuple(f"y{j}" for j in range(y.shape[1]))
    return Collection(client.compute(pairs), Columns(), int(x.shape[1]), targets=targets)


def _pair(*blocks: Any) -> tuple[Any, ...]:
    return blocks


def _in_blocks(client: Client, parts: list[Any]) -> list[Future]:
    """``parts`` (delayed partitions, in order, that read their own data) computed on the
    cluster, each worker (in name order) a block of consecutive ones, of about equal
    counts: Dask alone deals them out in turn, and the engine would then move half of
    them once (a fixed-order reduce over partitions alternating between workers is a
    message per pair and step).  Not for partitions made from data already on the
    cluster: the restriction would move that data instead.  A worker that cannot compute
    its block leaves it to another (a loose restriction)."""
    addresses = worker_addresses(client)
    if len(addresses) < 2:
        return client.compute(parts)
    edges = row_blocks([1] * len(parts), len(addresses))
    futures: list[Future] = []
    for b, worker in enumerate(addresses):
        block = parts[edges[b]:edges[b + 1]]
        if block:
            futures += client.compute(block, workers=[worker], allow_other_workers=True)
    return futures


def from_files(client: Client, cfg: DataConfig) -> Collection:
    """``data.path``'s files (a glob) read by the workers through dask.dataframe: Parquet
    with pyarrow, or CSV with the separator and header found in the first file."""
    import dask.dataframe as dd

    paths = _paths(cfg)
    if cfg.dataset == "parquet":
        frame = dd.read_parquet(paths, engine="pyarrow")
    else:
        layout = tables.sniff(Path(paths[0]), cfg.delimiter)
        frame = dd.read_csv(paths, sep=layout.delimiter, header=0 if layout.header else None,
                            **({} if layout.header else {"names": [
                                str(i) for i in range(layout.width)]}), blocksize=None)
    label = cfg.label or str(frame.columns[-1])
    coll = from_frame(client, frame, label, where=cfg.path, in_blocks=True)
    if frame.npartitions == len(paths):          # a partition per file: errors name the file
        coll.files = tuple(paths)
        coll.first_line = None if cfg.dataset == "parquet" else 2 if layout.header else 1
    return coll


# --- describing it ----------------------------------------------------------------------------

def describe(client: Client, coll: Collection, spec: PartSpec, fan_in: int) -> PartStats:
    """Every partition's :class:`PartStats` on its worker, merged in a tree of ``fan_in``
    in partition order; the merged total is also kept in ``coll.stats``."""
    run = uuid.uuid4().hex[:8]
    with client.as_current():              # distributed.wait asks the default client
        wait(coll.futures)                 # every partition read or computed, on its worker
    for future in coll.futures:
        if future.status == "error":
            future.result()                # the reading error, here
    holders = coll.holders(client)
    dsk, where, level = {}, {}, []
    for i, future in enumerate(coll.futures):
        key = keys.make(keys.PART_STATS, i, run=run)
        dsk[key] = Task(key, partitions.part_stats, spec, i, TaskRef(future.key))
        where[key] = holders[i]
        level.append(key)
    each = list(level)
    depth = 0
    while len(level) > 1:
        nxt = []
        for j in range(0, len(level), fan_in):
            group = level[j:j + fan_in]
            key = keys.make(keys.MERGE_STATS, depth, j // fan_in, run=run)
            dsk[key] = Task(key, partitions.merge, *(TaskRef(k) for k in group))
            where[key] = where[group[0]]
            nxt.append(key)
        level, depth = nxt, depth + 1
    with dask.annotate(workers=lambda k: [where[k]], allow_other_workers=True):
        futures = client.get(dsk, [level[0], *each], sync=False)
    total, *parts = client.gather(futures)
    total = partitions.located(total, parts, coll.files, coll.first_line)
    if coll.classes is not None:
        total = _with_classes(total, coll.classes)
    coll.stats, coll.parts = total, parts
    return total


def _with_classes(stats: PartStats, classes: tuple[Any, ...]) -> PartStats:
    """``stats`` learning the given classes (in their order) instead of the labels found,
    as when data arrives in batches that may each lack some class; a label found that is
    not among them is a :class:`DataError`."""
    known = set(classes)
    unknown = [label for label in stats.labels if label not in known]
    if unknown:
        raise DataError(f"the labels {', '.join(map(repr, unknown[:5]))} are not among the "
                        f"classes given ({', '.join(map(repr, classes))}); pass every class "
                        f"the data holds")
    return replace(stats, labels=tuple(classes))


def with_stats(spec: PartSpec, stats: PartStats, norm_kind: str) -> PartSpec:
    """The spec every shard-building task gets once the statistics are known (sample
    weights scaled to average 1 over the training rows)."""
    scale = stats.train / stats.mass if stats.mass else 1.0
    return replace(spec, classes=stats.labels, norm=partitions.normalization(stats, norm_kind),
                   weight_scale=scale)


def check_files(cfg: DataConfig, layers: tuple, input_shape: tuple[int, ...] = ()) -> None:
    """What can be known of ``data.path``'s files before any worker reads them: that the
    glob matches, that the label column is there, that the features are numeric and as many
    as ``model.layers[0]`` (a convolutional net: ``model.input_shape``'s C x H x W)
    (Parquet: from the first file's schema; CSV: its first lines)."""
    paths = _paths(cfg)
    names, numeric = _columns(cfg, paths[0])
    _same_columns(cfg, paths, names)
    label = cfg.label or names[-1]
    if label not in names:
        raise DataError(f"data.label = {label!r} is not a column of {paths[0]}; its columns "
                        f"are {', '.join(names)}")
    features = [n for n in names if n != label]
    bad = [n for n in features if not numeric[n]]
    if bad:
        raise DataError(f"feature column{'s' if len(bad) > 1 else ''} {', '.join(map(repr, bad))} "
                        f"of {paths[0]} {'are' if len(bad) > 1 else 'is'} not numeric; encode or "
                        f"drop {'them' if len(bad) > 1 else 'it'}, or name the label with "
                        f"data.label")
    if not isinstance(layers[0], int):
        if math.prod(input_shape) != len(features):
            raise DataError(f"model.input_shape = {list(input_shape)} holds "
                            f"{math.prod(input_shape)} features but {paths[0]} has "
                            f"{len(features)} feature columns ({label!r} is the label)")
    elif layers[0] != len(features):
        raise DataError(f"model.layers[0] = {layers[0]} but {paths[0]} has {len(features)} "
                        f"feature columns ({label!r} is the label); set model.layers = "
                        f"[{len(features)}, ...]")


def _paths(cfg: DataConfig) -> list[str]:
    """The files ``data.path`` names (a glob), in order; none is a DataError."""
    paths = sorted(glob.glob(cfg.path))
    if not paths:
        raise DataError(f"data.path = {cfg.path!r} matches no file; give a file or a glob such "
                        f"as /data/part-*.{'parquet' if cfg.dataset == 'parquet' else 'csv'}")
    return paths


def _columns(cfg: DataConfig, path: str) -> tuple[list[str], dict[str, bool]]:
    """A file's column names and whether each is numeric: from its Parquet schema (the
    footer only), or its CSV header (numeric: as dask finds the sample's types).

    A Parquet file's index columns are not among them: those its pandas metadata names
    (dask's ``__null_dask_index__``, a pandas index written as a column, ``id`` or
    ``__index_level_0__``), which ``dd.read_parquet`` reads as the index, as pandas does."""
    if cfg.dataset == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            schema = pq.read_schema(path)
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"cannot read {path} as Parquet: {exc}") from None
        index = {c for c in (schema.pandas_metadata or {}).get("index_columns", [])
                 if isinstance(c, str)}          # a dict is a RangeIndex: no column
        names = [n for n in schema.names
                 if n not in index and not n.startswith("__index_level_")]
        kind = pa.types
        return names, {n: kind.is_integer(t) or kind.is_floating(t) or kind.is_boolean(t)
                       for n, t in ((n, schema.field(n).type) for n in names)}
    layout = tables.sniff(Path(path), cfg.delimiter)
    names = list(layout.header or map(str, range(layout.width)))
    return names, dict.fromkeys(names, True)


def _same_columns(cfg: DataConfig, paths: list[str], names: list[str]) -> None:
    """Every file of the glob has the first one's columns (a stray file of another dataset
    would otherwise fail on a worker, mid-read, with pandas' KeyError)."""
    for path in paths[1:]:
        other, _ = _columns(cfg, path)
        if other != names:
            missing = [n for n in names if n not in other]
            extra = [n for n in other if n not in names]
            shown = ", ".join(map(repr, (missing or extra)[:5])) + \
                (", ..." if len(missing or extra) > 5 else "")
            what = (f"lacks columns {shown} that {paths[0]} has" if missing else
                    f"has columns {shown} that {paths[0]} lacks" if extra else
                    f"has the columns of {paths[0]} in another order")
            raise DataError(f"data.path = {cfg.path!r}: {path} {what}; every file of the glob "
                            f"must have the same columns: narrow the glob or move the stray "
                            f"files")
