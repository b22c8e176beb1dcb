from __future__ import annotations

import numpy as np
import pytest

from dtrain.core.config import DataConfig, load_config
from dtrain.core.errors import DataError
from dtrain.data import prepare, readers
from dtrain.data.shards import ShardSource, epoch_bounds, load_shard, shard_ranges
from helpers.datafiles import make_images, tiny_mnist, write_idx


# --- minibatch order ----------------------------------------------------------------------

@pytest.mark.parametrize("sizes, batch", [([75, 75], 1), ([3, 5, 4], 4), ([10, 11, 12, 13], 7),
                                          ([100], 32), ([5, 5], 100), ([1, 9], 3)])
def test_epoch_bounds_cover_each_row_once(sizes, batch):
    c = epoch_bounds(sizes, batch)
    assert (c[0] == 0).all() and (c[-1] == sizes).all()
    assert (np.diff(c, axis=0) >= 0).all()                       # each row taken once, in order
    per_step = np.diff(c, axis=0).sum(axis=1)
    total = sum(sizes)
    assert (per_step[:-1] == min(batch, total)).all() and per_step[-1] == total - batch * (len(per_step) - 1)


def test_epoch_bounds_interleave_shards_evenly():
    c = epoch_bounds([8, 8], 2)
    assert (np.diff(c, axis=0) == 1).all()                       # one row from each shard per step
    stochastic = np.diff(epoch_bounds([6, 6], 1), axis=0)
    assert (stochastic.sum(axis=1) == 1).all()                   # batch 1: never an empty step


def test_shard_ranges_are_contiguous_and_balanced():
    r = shard_ranges(10, 3, 4)
    assert r == [(0, 8), (8, 15), (15, 22), (22, 30)]
    with pytest.raises(DataError, match="data.shards = 40 but there are only 30 training samples"):
        shard_ranges(10, 3, 40)


# --- split and normalization ------------------------------------------------------------------

def test_split_sizes():
    assert prepare.split_sizes(150, (0.7, 0.1, 0.2), False) == (105, 15, 30)
    assert prepare.split_sizes(1000, (0.8, 0.1, 0.1), True) == (889, 111, 0)


def test_standardization_uses_training_statistics_only():
    cfg = DataConfig(dataset="iris", split=(0.6, 0.2, 0.2), seed=3)
    parts, _ = prepare.prepared(cfg, None)
    xt = parts["train"][0]
    np.testing.assert_allclose(xt.mean(axis=0), 0, atol=1e-12)
    np.testing.assert_allclose(xt.std(axis=0), 1, atol=1e-12)
    assert abs(parts["test"][0].mean(axis=0)).max() > 1e-3      # not re-centred on its own stats
    raw = readers.read_raw(cfg)
    train_rows = prepare.split_indices(cfg, len(raw.y), False)[0]
    mu, sd = raw.x[train_rows].mean(axis=0), raw.x[train_rows].std(axis=0)
    test_rows = prepare.split_indices(cfg, len(raw.y), False)[2]
    np.testing.assert_allclose(parts["test"][0], (raw.x[test_rows] - mu) / sd)


def test_minmax_and_seeded_split():
    cfg = DataConfig(dataset="digits", normalize="minmax", seed=1)
    xt = prepare.prepared(cfg, None)[0]["train"][0]
    assert xt.min() == 0 and xt.max() == 1
    a = prepare.prepared(DataConfig(dataset="digits", seed=1), None)[0]["val"][1]
    b = prepare.prepared(DataConfig(dataset="digits", seed=2), None)[0]["val"][1]
    assert not (a == b).all()


def test_replicated_shards_repeat_the_training_set():
    cfg = DataConfig(dataset="iris", replicate=3, shards=3, split=(0.8, 0.1, 0.1))
    info = prepare.describe(cfg)
    ranges = shard_ranges(info.train, 3, 3)
    shards = [load_shard(ShardSource(cfg, i, a, b, info.train, "float64"))
              for i, (a, b) in enumerate(ranges)]
    x = np.concatenate([s.x for s in shards])
    assert x.shape[0] == 3 * info.train
    np.testing.assert_array_equal(x[: info.train], x[info.train: 2 * info.train])


def test_shard_batches_shuffle_per_epoch():
    cfg = DataConfig(dataset="iris")
    s = load_shard(ShardSource(cfg, 0, 0, 30, prepare.describe(cfg).train, "float32"))
    assert s.x.dtype == np.float32 and len(s) == 30
    e0, e1 = s.batch(0, 0, 30, seed=0)[1], s.batch(1, 0, 30, seed=0)[1]
    assert sorted(e0) == sorted(e1) == sorted(s.y) and not (e0 == e1).all()
    assert (s.batch(0, 0, 30, seed=None)[1] == s.y).all()


# --- sources -----------------------------------------------------------------------------

def test_real_mnist(mnist_dir):
    cfg = load_config("configs/mnist.toml", [f"data.path={mnist_dir}"]).data
    info = prepare.describe(cfg)
    assert (info.features, info.classes, info.train + info.val + info.test) == (784, 10, 10000)
    x, y = prepare.prepared(cfg, None)[0]["test"]
    assert x.shape == (info.test, 784) and set(np.unique(y)) == set(range(10))


def test_mnist_resize_and_official_split(tmp_path):
    tiny_mnist(tmp_path, n=30, prefix="train")
    tiny_mnist(tmp_path, n=12, prefix="t10k")
    cfg = DataConfig(dataset="mnist", path=str(tmp_path), image_size=(14, 10), split=(0.8, 0.2, 0.0))
    info = prepare.describe(cfg)
    assert (info.features, info.train, info.val, info.test) == (140, 24, 6, 12)
    assert prepare.prepared(cfg, None)[0]["test"][0].shape == (12, 140)


@pytest.mark.parametrize("corrupt, message", [
    ({"magic": b"\x12\x34\x56\x78"}, "bad magic number 12345678"),
    ({"cut": 100}, "truncated: header promises 31360 bytes"),
])
def test_corrupt_idx_files(tmp_path, corrupt, message):
    tiny_mnist(tmp_path, **corrupt)
    with pytest.raises(DataError, match=message):
        readers.read_raw(DataConfig(dataset="mnist", path=str(tmp_path)))


def test_idx_count_mismatch(tmp_path):
    tiny_mnist(tmp_path)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(39))
    with pytest.raises(DataError, match="has 40 images but .* has 39 labels"):
        readers.read_raw(DataConfig(dataset="mnist", path=str(tmp_path)))


def test_missing_mnist_dir(tmp_path):
    with pytest.raises(DataError, match="MNIST directory .* not found"):
        prepare.describe(DataConfig(dataset="mnist", path=str(tmp_path / "nope")))
    with pytest.raises(DataError, match="no MNIST IDX files"):
        prepare.describe(DataConfig(dataset="mnist", path=str(tmp_path)))


def test_image_folder(tmp_path):
    make_images(tmp_path)
    cfg = DataConfig(dataset="image-folder", path=str(tmp_path), image_size=(5, 4), grayscale=False,
                     split=(0.5, 0.25, 0.25))
    info = prepare.describe(cfg)
    assert (info.features, info.classes, info.train) == (5 * 4 * 3, 3, 6)
    raw = readers.read_raw(cfg)
    assert raw.x.shape == (12, 60) and list(raw.y) == [0] * 4 + [1] * 4 + [2] * 4


def test_image_folder_errors(tmp_path):
    (tmp_path / "empty" / "a").mkdir(parents=True)
    with pytest.raises(DataError, match="0 class folder"):
        prepare.describe(DataConfig(dataset="image-folder", path=str(tmp_path / "empty"), image_size=(4, 4)))
    make_images(tmp_path / "bad")
    (tmp_path / "bad" / "dog" / "broken.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match="cannot read image .*broken.png"):
        readers.read_raw(DataConfig(dataset="image-folder", path=str(tmp_path / "bad"), image_size=(4, 4)))


def test_csv_dataset(shared_data):
    cfg = DataConfig(dataset="csv", path=str(shared_data / "iris" / "iris.csv"))
    info = prepare.describe(cfg)
    assert (info.features, info.classes) == (4, 3)
    cfg = DataConfig(dataset="csv", path=str(shared_data / "digits.csv.gz"))
    assert (prepare.describe(cfg).features, prepare.describe(cfg).classes) == (64, 10)


def test_synthetic_rows_are_generated_consistently():
    cfg = DataConfig(dataset="synthetic", samples=10000, features=6, classes=4, normalize="none")
    whole = readers.read_raw(cfg)
    rows = np.array([5, 4100, 9999, 0, 4096])
    x, y = readers.synthetic_rows(cfg, rows)
    np.testing.assert_array_equal(x, whole.x[rows])
    np.testing.assert_array_equal(y, whole.y[rows])
    assert len(np.unique(whole.y)) == 4


def test_threads_loading_side_by_side_read_and_prepare_the_dataset_once():
    """A hybrid worker's threads load their shards at once: each asks for the whole prepared
    dataset, and all of them get the one copy (``functools.lru_cache`` alone computed one per
    thread: 16 threads, 16 copies of the data in the worker's memory)."""
    from concurrent.futures import ThreadPoolExecutor

    cfg = load_config(None, ["data.dataset=synthetic", "data.samples=20000",
                             "data.features=200", "data.classes=3",
                             "model.layers=[200, 3]"]).data
    prepare.clear_cache()
    with ThreadPoolExecutor(8) as pool:
        raws = list(pool.map(lambda _: readers.read_raw(cfg), range(8)))
        parts = list(pool.map(lambda _: prepare.prepared(cfg), range(8)))
    assert all(r is raws[0] for r in raws) and all(p is parts[0] for p in parts)
    assert readers.read_raw.cache_info().misses == 1 and prepare.prepared.cache_info().misses == 1
    prepare.clear_cache()
    assert readers.read_raw.cache_info().currsize == 0


def _epoch_bounds_by_sorting(sizes: list[int], batch_size: int) -> np.ndarray:
    """The specification of epoch_bounds, a row per sample: every sample's key sorted."""
    sizes = np.asarray(sizes)
    total = int(sizes.sum())
    shard = np.repeat(np.arange(sizes.size), sizes)                    # (N,)
    rank = np.arange(total) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    key = (2 * rank + 1) / (2 * sizes[shard])                          # (N,)
    by_shard = np.argsort(shard[np.lexsort((shard, key))], kind="stable")
    cuts = np.minimum(np.arange(-(-total // batch_size) + 1) * batch_size, total)
    counts = np.empty((cuts.size, sizes.size), dtype=np.int64)
    for i, start in enumerate(np.cumsum(sizes) - sizes):
        counts[:, i] = np.searchsorted(by_shard[start:start + sizes[i]], cuts)
    return counts


def test_epoch_bounds_equal_sorting_every_sample_without_its_memory():
    """Random shard sizes (ties, empty shards, equal sizes, batches above the total): the
    same counts as sorting every sample's key; and a 100-million-row epoch plans in a few
    MB (sorting took a row of memory per sample in the driver: 3 GB)."""
    import tracemalloc

    rng = np.random.default_rng(0)
    cases = [([5, 5, 5], 2), ([3, 0, 4], 2), ([100, 100], 7), ([7], 3)]
    for _ in range(1500):
        sizes = rng.integers(0, 40, size=rng.integers(1, 7)).tolist()
        if sum(sizes):
            cases.append((sizes, int(rng.integers(1, sum(sizes) + 2))))
    for _ in range(100):
        unit = int(rng.integers(1, 50))
        sizes = [unit * int(rng.integers(1, 4)) for _ in range(rng.integers(1, 9))]
        cases.append((sizes, int(rng.integers(1, sum(sizes) + 2))))
    for sizes, batch in cases:
        np.testing.assert_array_equal(epoch_bounds(sizes, batch),
                                      _epoch_bounds_by_sorting(sizes, batch), err_msg=str(sizes))
    tracemalloc.start()
    counts = epoch_bounds([6_250_001] * 15 + [6_249_990], 65_536)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert counts.shape == (1527, 16) and counts[-1].sum() == 100_000_005
    assert (np.diff(counts.sum(axis=1))[:-1] == 65_536).all() and peak < 20 << 20
