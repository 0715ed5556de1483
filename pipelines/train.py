"""`shardsmith train`: resolve a dataset's trainer and its config, then run it, on one process or
data parallel (`--nproc N`, or under torchrun)."""
from __future__ import annotations

import importlib
import json
import os

from core import storage
from core.config import ConfigError
from pipelines.dataset import Dataset
from schemas import SchemaError
from trainers import interface
from trainers.tables import DatasetError
from transforms.io import layout


def _call(module_name: str, func: str, data: str, out: str, values: dict) -> dict:
    """The trainer's train(data, out, config), in this process (a spawned rank imports it by name)."""
    return getattr(importlib.import_module(module_name), func)(data, out, values)


def _checked_data(dataset: Dataset, data: str, trainer: str | None, nproc: int) -> dict:
    """The manifest of `data`, once the trainer, --nproc and --data make sense (ConfigError: what to fix)."""
    if trainer is not None and trainer not in dataset.trainers:
        have = ", ".join(sorted(dataset.trainers)) or "none besides the default"
        raise ConfigError(f"--trainer {trainer!r}: {dataset.name} has no such trainer (named trainers: {have})")
    if nproc < 1:
        raise ConfigError(f"--nproc must be at least 1, got {nproc}")
    if nproc > 1 and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("--nproc under torchrun: torchrun starts the processes, drop --nproc")
    try:
        storage.check_readable(data)
    except storage.StorageError as exc:
        raise ConfigError(f"--data: {exc}") from None
    if not storage.is_dir(data):
        raise ConfigError(f"--data {data!r} is not a folder (expected OUT/{dataset.name} from `shardsmith run`)")
    manifest = layout.read_manifest(data)
    if manifest.get("dataset") != dataset.name:
        raise ConfigError(f"{data} holds dataset {manifest.get('dataset')!r}, not {dataset.name!r}")
    return manifest


def _trainer_module(dataset: Dataset, module_name: str):
    """The trainer's module, or a ConfigError that names the missing extra."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise ConfigError(f"this shardsmith has no {dataset.name} trainer yet ({module_name})") from None
        raise ConfigError(f"the {dataset.name} trainer needs the train extra "
                          f"(pip install 'shardsmith[train]'): {exc}") from None
    except ImportError as exc:
        raise ConfigError(f"the {dataset.name} trainer needs the train extra "
                          f"(pip install 'shardsmith[train]'): {exc}") from None


def train(dataset: Dataset, data: str, out: str | None, sets: list[str], nproc: int = 1,
          trainer: str | None = None) -> tuple[str, str | None]:
    """Train with the dataset's trainer, or the one named `trainer`; (out folder, metrics.json path,
    None on ranks other than 0)."""
    manifest = _checked_data(dataset, data, trainer, nproc)
    module_name, func = (dataset.trainer if trainer is None else dataset.trainers[trainer]).split(":")
    module = _trainer_module(dataset, module_name)
    interface.check(module, func, dataset.name)
    if nproc > 1 and not interface.data_parallel(module):
        raise ConfigError(f"the {dataset.name} trainer runs on one process: drop --nproc")
    resolved = module.CONFIG.resolve(None, sets)
    values = dataset.train_setup(dict(resolved.values), manifest) if trainer is None else resolved.values
    # trainers write checkpoints to a local folder: beside local data, else in the working folder
    suffix = "-" + (trainer or "train")
    out = out or (f"{dataset.name}{suffix}" if storage.is_remote(data) else os.path.normpath(data) + suffix)
    os.makedirs(out, exist_ok=True)
    from trainers import distributed   # torch: the train extra, imported once a trainer runs
    try:
        if nproc > 1:
            metrics = distributed.launch(_call, nproc, module_name, func, data, out, values,
                                         device=values.get("device"), preload=(module_name,))
        else:
            distributed.join_env(values.get("device"))      # torchrun: this process is one rank
            metrics = _call(module_name, func, data, out, values)
    except (DatasetError, SchemaError) as exc:  # data the trainer cannot use: say why, no traceback
        raise ConfigError(str(exc)) from None
    if not distributed.is_main():
        return out, None
    metrics_path = os.path.join(out, "metrics.json")
    with open(metrics_path, "w") as fh:
        json.dump(metrics, fh, indent=2, sort_keys=True)
    summary = interface.report(module, metrics)
    if summary:
        print(summary)
    return out, metrics_path
