from __future__ import annotations

import pytest

from dtrain.core.config import CONFIG_DIR, Config, ConfigError, load_config, parse_override


def test_default_is_iris():
    cfg = load_config()
    assert cfg.data.dataset == "iris"
    assert cfg.graph.strategy == "allreduce"


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.toml")), ids=lambda p: p.name)
def test_shipped_configs_load(path):
    load_config(path)


def test_overrides_are_toml_values():
    cfg = load_config(None, ["train.epochs=3", "optim.lr=0.05", "model.layers=[4, 8, 8, 3]",
                             "data.shuffle=false", 'graph.strategy="serial"'])
    assert cfg.train.epochs == 3 and cfg.optim.lr == 0.05
    assert cfg.model.layers == (4, 8, 8, 3)
    assert cfg.data.shuffle is False and cfg.graph.strategy == "serial"


def test_bare_word_override_is_a_string(tmp_path):
    cfg = load_config(None, [f"data.path={tmp_path}/mnist", "graph.strategy=parameter-server"])
    assert cfg.data.path == f"{tmp_path}/mnist"
    assert cfg.graph.strategy == "parameter-server"


def test_a_string_key_takes_a_word_that_is_also_toml_as_written(tmp_path):
    cfg = load_config(None, [f"data.path={tmp_path}/2024", "cluster.interface=true",
                             "cluster.scheduler_address=1e3"])
    assert cfg.cluster.interface == "true" and cfg.cluster.scheduler_address == "1e3"
    with pytest.raises(ConfigError, match="train.epochs = 'many'"):
        load_config(None, ["train.epochs=many"])          # other keys still check the type


def test_relative_data_path_becomes_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["data.path=some/dir"])
    assert cfg.data.path == str(tmp_path / "some" / "dir")


def test_round_trip_through_toml(tmp_path):
    cfg = load_config(None, ["model.layers=[4, 5, 3]", "optim.name=adam"])
    path = tmp_path / "config.toml"
    path.write_text(cfg.to_toml())
    assert load_config(path) == cfg


def test_replace_validates():
    cfg = Config()
    assert cfg.replace(train={"epochs": 7}).train.epochs == 7
    with pytest.raises(ConfigError, match="train.epochs = 0"):
        cfg.replace(train={"epochs": 0})


@pytest.mark.parametrize("override, message", [
    ("data.colour=1", "unknown key 'data.colour'"),
    ("nosuch.key=1", r"unknown section \[nosuch\]"),
    ("train.epochs=ten", "train.epochs = 'ten'.*expected an integer"),
    ("train.epochs=2.5", "expected an integer"),
    ("train.epochs=true", "expected an integer"),
    ("optim.lr=-0.1", r"optim.lr = -0.1 .*must be > 0"),
    ("optim.lr=0", "must be > 0"),
    ("optim.lr=nan", "must be > 0"),
    ("train.batch_size=0", r"train.batch_size = 0 .*must be >= 1"),
    ("model.activation=swish", "model.activation = 'swish'.*one of 'sigmoid', 'tanh', 'relu'"),
    ("model.loss=hinge", "model.loss = 'hinge'"),
    ("graph.strategy=ring", "graph.strategy = 'ring'"),
    ("graph.fan_in=1", "graph.fan_in = 1"),
    ("data.split=[0.5, 0.2]", "data.split = \\[0.5, 0.2\\]"),
    ("data.split=[0.5, 0.2, 0.2]", "summing to 1"),
    ("model.layers=[4]", "model.layers = \\[4\\]"),
    ("model.layers=[4, 0, 3]", "positive sizes"),
    ("data.dataset=mnist", "data.path is empty.*mnist"),
    ("train", "expected section.key=VALUE"),
])
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nepochs = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    notable = tmp_path / "flat.toml"
    notable.write_text("epochs = 3\n")
    with pytest.raises(ConfigError, match="unknown section \\[epochs\\]"):
        load_config(notable)


def test_parse_override_keeps_equals_in_value():
    assert parse_override("data.path=/a=b") == ("data", "path", "/a=b")


def test_fuse_shards_takes_auto_and_the_old_booleans(tmp_path):
    """graph.fuse_shards is 'auto' by default; TOML true/false (older config.toml files) and
    --set words give 'true'/'false'; anything else is refused by name."""
    assert load_config().graph.fuse_shards == "auto"
    path = tmp_path / "old.toml"
    path.write_text("[graph]\nfuse_shards = false\n")
    assert load_config(path).graph.fuse_shards == "false"
    assert load_config({"graph": {"fuse_shards": True}}).graph.fuse_shards == "true"
    assert load_config(None, ["graph.fuse_shards=false"]).graph.fuse_shards == "false"
    with pytest.raises(ConfigError, match="graph.fuse_shards = 'maybe' .* one of 'auto'"):
        load_config(None, ["graph.fuse_shards=maybe"])
    with pytest.raises(ConfigError, match="data.dataset = True .* expected a string"):
        load_config({"data": {"dataset": True}})     # other string keys take no bool


def test_cluster_shape_keys_default_to_the_layout():
    c = load_config({}).cluster
    assert (c.workers, c.threads_per_worker, c.layout) == (0, 0, "hybrid")
    with pytest.raises(ConfigError, match="cluster.layout = 'wide' .* one of 'hybrid', 'flat'"):
        load_config({}, ["cluster.layout=wide"])
    with pytest.raises(ConfigError, match="cluster.workers = -1 .* must be >= 0"):
        load_config({}, ["cluster.workers=-1"])


# --- graph.strategy: its values and rules known to the config, below the strategies --------

def test_the_strategies_are_the_names_the_config_accepts():
    """The strategy objects (dtrain.taskgraph.strategies, a layer above the config) are the
    config's names in the config's order, and every name has its rules in the config."""
    from dtrain.core.config import STRATEGIES
    from dtrain.core.config.rules import STRATEGY_RULES
    from dtrain.taskgraph import strategies
    assert tuple(strategies.STRATEGIES) == STRATEGIES
    assert tuple(STRATEGY_RULES) == STRATEGIES
    assert all(strategies.get(name).name == name for name in STRATEGIES)


@pytest.mark.parametrize("overrides, message", [
    (["graph.strategy=parameter-server", "optim.name=lbfgs"],
     "optim.name = 'lbfgs' .* not graph.strategy = 'parameter-server'"),
    (["graph.strategy=serial", "graph.update=replicated"],
     "graph.update = 'replicated' .* not 'serial'"),
    (["graph.strategy=local-sgd", "optim.schedule=adaptive", "graph.sync_every=4"],
     "which graph.strategy = 'local-sgd' splits"),
    (["graph.strategy=model-parallel", "optim.schedule=adaptive"],
     "which graph.strategy = 'model-parallel' splits"),
    (["graph.strategy=model-parallel", "cluster.device=gpu"], "runs on CPU workers only"),
    (["graph.strategy=model-parallel", "model.layers=[4, 3]"], "splits hidden layers"),
])
def test_each_strategy_s_rules(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_allreduce_takes_what_the_others_refuse():
    cfg = load_config(None, ["optim.name=lbfgs", "graph.update=replicated"])
    assert cfg.graph.strategy == "allreduce"
    assert load_config(None, ["graph.strategy=local-sgd", "optim.schedule=adaptive",
                              "graph.sync_every=1"]).graph.strategy == "local-sgd"


def test_a_config_is_checked_alike_whatever_was_imported_before():
    """The config module alone, in a fresh process, refuses what a strategy cannot run and
    has not imported the task graphs to know it."""
    import subprocess
    import sys
    code = ("import sys\n"
            "from dtrain.core.config import ConfigError, load_config\n"
            "try:\n"
            "    load_config(None, ['graph.strategy=model-parallel', 'cluster.device=gpu'])\n"
            "except ConfigError as exc:\n"
            "    print(exc)\n"
            "print(sorted(m for m in sys.modules if m.startswith('dtrain.')\n"
            "             and not m.startswith('dtrain.core')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert "runs on CPU workers only" in out[0] and out[1] == "[]"
