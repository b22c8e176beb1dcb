"""Loading a run configuration: TOML files, ``--set`` overrides, and paths made absolute.

:func:`load_config` reads a file (or takes a mapping), applies the overrides in order,
builds and checks the :class:`~dtrain.core.config.rules.Config`
(:func:`~dtrain.core.config.rules.from_dict`), and makes the paths in it absolute against
the current directory, so that workers elsewhere find the same files.  Anything wrong is
one :class:`~dtrain.core.errors.ConfigError` line.
"""
from __future__ import annotations

import dataclasses
import tomllib
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dtrain.core.config.rules import Config, from_dict
from dtrain.core.config.schema import SECTIONS
from dtrain.core.errors import ConfigError
from dtrain.core.files import shipped

CONFIG_DIR = shipped("configs")
DEFAULT_CONFIG = CONFIG_DIR / "iris.toml"


def parse_override(text: str) -> tuple[str, str, Any]:
    """Split ``section.key=VALUE``; VALUE is TOML, or a plain string if it is not."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    section, dot, name = key.partition(".")
    if not sep or not dot or not section or not name or "." in name:
        raise ConfigError(f"--set {text!r}: expected section.key=VALUE, "
                          f"e.g. --set train.epochs=5")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return section, name, value


def apply_overrides(data: dict[str, dict[str, Any]], overrides: Iterable[str]) -> dict:
    """Apply ``--set`` strings to a nested dict (in place) and return it."""
    for text in overrides:
        section, name, value = parse_override(text)
        kinds = {f.name: f.type for f in dataclasses.fields(SECTIONS[section])} \
            if section in SECTIONS else {}
        if kinds.get(name) in (str, "str") and isinstance(value, (int, float, bool)):
            value = text.partition("=")[2].strip()   # a string key takes the word as written
        data.setdefault(section, {})[name] = value
    return data


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file, turning I/O and syntax errors into one-line user errors."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found; pass an existing file to "
                          f"--config (see {CONFIG_DIR}/)") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def load_config(path: str | Path | Mapping[str, Any] | None = None,
                overrides: Iterable[str] = ()) -> Config:
    """Load, override and validate a run configuration.

    Parameters
    ----------
    path
        A TOML file, a ``{"section": {...}}`` mapping, or None for
        ``configs/iris.toml``.
    overrides
        ``"section.key=VALUE"`` strings applied on top, in order.

    Returns
    -------
    Config
        With relative ``data.path``, ``cluster.jobqueue_file`` and
        ``cluster.scheduler_file`` made absolute (against the current directory), so workers elsewhere find
        the same files, and ``track.mlflow_uri`` a ``file:`` URI of an
        absolute path when it names a local directory.
    """
    if path is None:
        path = DEFAULT_CONFIG
    if isinstance(path, Mapping):
        data, source = {k: dict(v) if isinstance(v, Mapping) else v for k, v in path.items()}, \
            "the given mapping"
    else:
        data, source = read_toml(path), str(path)
    overrides = list(overrides)
    if overrides:
        source += " (with --set overrides)"
    apply_overrides(data, overrides)
    cfg = from_dict(data, source)
    for section, key in (("data", "path"), ("cluster", "jobqueue_file"), ("model", "init_from"),
                         ("cluster", "scheduler_file")):
        part = getattr(cfg, section)
        value = getattr(part, key)
        if value and not Path(value).is_absolute():
            cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(
                part, **{key: str(Path(value).resolve())})})
    uri = local_store_uri(cfg.track.mlflow_uri)
    if uri != cfg.track.mlflow_uri:
        cfg = dataclasses.replace(cfg, track=dataclasses.replace(cfg.track, mlflow_uri=uri))
    return cfg


def local_store_uri(uri: str) -> str:
    """A directory or a local ``file:`` URI as an absolute ``file:`` URI; any other URI (and
    MLflow's ``databricks``) as given."""
    parts = urllib.parse.urlparse(uri)
    if parts.scheme not in ("", "file") or parts.netloc or uri in ("databricks", "databricks-uc"):
        return uri
    return Path(urllib.parse.unquote(parts.path) if parts.scheme else uri).resolve().as_uri()
