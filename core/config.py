"""Typed dataset configs: defaults, a YAML file, `--set key=value`, and grids.

A value given as a list (`--set m=[100,1000]`) turns the run into a grid: one
experiment per combination of the listed values. Every mistake a user can
make here raises ConfigError with one line that names the key and the fix.
"""
from __future__ import annotations

import dataclasses
import difflib
import itertools
import os
from dataclasses import dataclass
from typing import Any, Callable

import pyarrow as pa
import yaml

from core import storage


# names users reach for, and the one name each thing has in every config
RENAMED = {"steps": "max_steps", "num_steps": "max_steps", "train_steps": "max_steps", "batch": "batch_size",
           "bs": "batch_size", "learning_rate": "lr"}


class ConfigError(ValueError):
    """A user mistake in a config file or a --set; the CLI prints it and exits 2."""


@dataclass(frozen=True)
class Key:
    name: str
    type: type  # int, float, str, bool; `path` keys are str with must_exist
    default: Any
    doc: str
    low: float | None = None
    high: float | None = None
    choices: tuple | None = None
    optional: bool = False  # None allowed
    is_path: bool = False
    gridable: bool = True

    def coerce(self, value: Any) -> Any:
        """Check and convert one value, or raise ConfigError naming the key."""
        if value is None:
            if self.optional:
                return None
            raise ConfigError(f"key {self.name!r} needs a value ({self.doc})")
        value = self._typed(value)
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"key {self.name!r} must be one of {list(self.choices)}, got {value!r}")
        if self.low is not None and value < self.low or self.high is not None and value > self.high:
            raise ConfigError(f"key {self.name!r} must be in [{_fmt(self.low)}, {_fmt(self.high)}], got {value!r}")
        if self.is_path and not stored(value, self.name, storage.exists):
            raise ConfigError(f"key {self.name!r}: file {value!r} not found")
        return value

    def _typed(self, value: Any) -> Any:
        kind = self.type.__name__
        if self.type is bool:
            if isinstance(value, bool):
                return value
        elif self.type is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, float) and value.is_integer():
                return int(value)
            if isinstance(value, str):
                try:
                    number = float(value)  # also 1e4, which YAML reads as a string
                except ValueError:
                    number = None
                if number is not None and number.is_integer():
                    return int(number)
        elif self.type is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            if isinstance(value, str):
                try:
                    return float(value)
                except ValueError:
                    pass
        elif self.type is str:
            if isinstance(value, (str, int, float)) and not isinstance(value, bool):
                return str(value)
        raise ConfigError(f"key {self.name!r} expects {'an' if kind[0] in 'aeiou' else 'a'} {kind}, got {value!r}")


def _fmt(bound):
    return "inf" if bound is None else f"{bound:g}"


@dataclass(frozen=True)
class ConfigSpec:
    """The keys of one dataset (or trainer) config, and a cross-key check."""

    keys: tuple[Key, ...]
    check: Callable[[dict], None] | None = None

    def key(self, name: str) -> Key:
        for k in self.keys:
            if k.name == name:
                return k
        if RENAMED.get(name) in {k.name for k in self.keys}:
            raise ConfigError(f"unknown key {name!r} (did you mean {RENAMED[name]!r}? one thing has one name "
                              f"in every config: max_steps, batch_size, lr)")
        close = difflib.get_close_matches(name, [k.name for k in self.keys], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown key {name!r}{hint}; known keys: {', '.join(k.name for k in self.keys)}")

    def defaults(self) -> dict:
        return {k.name: k.default for k in self.keys}

    def resolve(self, config_file: str | None = None, sets: list[str] = ()) -> "Resolved":
        """Defaults, then the YAML file, then each --set, then checks and grid expansion."""
        raw = self.defaults()
        if config_file:
            raw.update(self._from_file(config_file))
        for item in sets:
            name, value = parse_set(item)
            self.key(name)
            raw[name] = value
        swept = [k.name for k in self.keys if isinstance(raw[k.name], list)]
        values = {}
        for k in self.keys:
            if k.name in swept:
                if not k.gridable:
                    raise ConfigError(f"key {k.name!r} takes one value, not a list")
                if not raw[k.name]:
                    raise ConfigError(f"key {k.name!r}: an empty list gives no experiment")
                values[k.name] = [k.coerce(v) for v in raw[k.name]]
            else:
                values[k.name] = k.coerce(raw[k.name])
        grid = []
        for combo in itertools.product(*(values[name] for name in swept)):
            point = dict(values, **dict(zip(swept, combo)))
            if self.check:
                self.check(point)
            grid.append(point)
        return Resolved(values=values, swept=swept, grid=grid)

    def _from_file(self, path: str) -> dict:
        if not os.path.exists(path):
            raise ConfigError(f"config file {path!r} not found")
        try:
            with open(path) as fh:
                data = yaml.safe_load(fh) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path!r} is not valid YAML: {str(exc).splitlines()[0]}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path!r} must hold a mapping of key: value")
        for name in data:
            self.key(str(name))
        return {str(k): v for k, v in data.items()}


def probability(name: str, value: float) -> float:
    """`value` as a float in [0, 1]; ValueError naming `name` otherwise (for arguments of math
    functions, which config Keys do not check)."""
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return value


def parse_set(item: str) -> tuple[str, Any]:
    """`key=value` with a YAML value: numbers, booleans, lists like [1,2,3], or a string."""
    name, sep, text = item.partition("=")
    if not sep or not name.strip():
        raise ConfigError(f"--set expects key=value, got {item!r}")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        value = text
    return name.strip(), value


@dataclass(frozen=True)
class Resolved:
    """A resolved config: the values (lists for swept keys) and one dict per grid point."""

    values: dict
    swept: list[str]
    grid: list[dict]


def settings_from(cls: type, values: dict, **given: Any) -> Any:
    """An instance of the dataclass `cls`: each field from `given`, else from the config value of
    the same name, else the field's own default.

    Why: a key reaches the graph by its name, so a new key is its Key and the field that reads it,
    with no line in between to forget; `given` is for what is computed (a backend, seconds turned
    into milliseconds). tests/test_config_keys.py checks that a field and its key agree on the default."""
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(given) - fields)
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {', '.join(unknown)}")
    return cls(**{name: values[name] for name in fields - set(given) if name in values}, **given)


def names(text: str | None) -> list[str]:
    """The items of a comma-separated value, stripped, empty ones dropped."""
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def stored(location: str, key: str, ask: Callable[[str], Any]) -> Any:
    """`ask(location)`, with a store that cannot answer (unknown scheme, unreachable, missing bucket,
    refused credentials) turned into a one-line ConfigError naming the key, before any pipeline starts."""
    try:
        return ask(location)
    except storage.StorageError as exc:
        raise ConfigError(f"key {key!r}: {exc}") from None
    except (OSError, pa.ArrowException) as exc:
        raise ConfigError(f"key {key!r}: {storage.store_error(location, exc)}") from None


def matching_files(text: str | None, key: str) -> list[str]:
    """The files a value of comma-separated paths or glob patterns names, in order: local ones as
    absolute paths, store ones as s3:// or gs:// URLs. A pattern that matches nothing is a
    ConfigError naming the key; in a store, a missing or unreadable bucket says so instead."""
    files = []
    for pattern in names(text):
        found = stored(pattern, key, storage.glob)
        if not found:
            if storage.is_remote(pattern):  # a listing of a missing bucket is empty too: say which it is
                stored(f"{storage.scheme(pattern)}://{storage.bucket(pattern)}", key, storage.check_readable)
            raise ConfigError(f"key {key!r}: no file matches {pattern!r}")
        files += found
    return files
