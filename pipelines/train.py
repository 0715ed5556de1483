"""`shardsmith train`: resolve a dataset's trainer and its config, then run it."""
from __future__ import annotations

import importlib
import json
import os

from schemas.config import ConfigError, ConfigSpec, Key
from pipelines.dataset import Dataset
from schemas import storage
from transforms.io import layout


def trainer_config(module) -> ConfigSpec:
    """A trainer declares CONFIG = {key: (type, default, doc[, low, high])} (trainers cannot import
    pipelines/, so the typed spec is built here)."""
    keys = []
    for name, (kind, default, doc, *bounds) in module.CONFIG.items():
        low, high = (bounds + [None, None])[:2]
        keys.append(Key(name, kind, default, doc, low=low, high=high, optional=default is None, gridable=False))
    return ConfigSpec(tuple(keys))


def train(dataset: Dataset, data: str, out: str | None, sets: list[str]) -> tuple[str, str]:
    try:
        storage.check_readable(data)
    except storage.StorageError as exc:
        raise ConfigError(f"--data: {exc}") from None
    if not storage.is_dir(data):
        raise ConfigError(f"--data {data!r} is not a folder (expected OUT/{dataset.name} from `shardsmith run`)")
    manifest = layout.read_manifest(data)
    if manifest.get("dataset") != dataset.name:
        raise ConfigError(f"{data} holds dataset {manifest.get('dataset')!r}, not {dataset.name!r}")
    module_name, func = dataset.trainer.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise ConfigError(f"this shardsmith has no {dataset.name} trainer yet ({module_name})") from None
        raise ConfigError(f"the {dataset.name} trainer needs the train extra "
                          f"(pip install 'shardsmith[train]'): {exc}") from None
    except ImportError as exc:
        raise ConfigError(f"the {dataset.name} trainer needs the train extra "
                          f"(pip install 'shardsmith[train]'): {exc}") from None
    resolved = trainer_config(module).resolve(None, sets)
    values = dataset.train_setup(dict(resolved.values), manifest) if dataset.train_setup else resolved.values
    # trainers write checkpoints to a local folder: beside local data, else in the working folder
    out = out or (f"{dataset.name}-train" if storage.is_remote(data) else os.path.normpath(data) + "-train")
    os.makedirs(out, exist_ok=True)
    from schemas import SchemaError
    from trainers.data import DatasetError
    try:
        metrics = getattr(module, func)(data, out, values)
    except (DatasetError, SchemaError) as exc:  # data the trainer cannot use: say why, no traceback
        raise ConfigError(str(exc)) from None
    metrics_path = os.path.join(out, "metrics.json")
    with open(metrics_path, "w") as fh:
        json.dump(metrics, fh, indent=2, sort_keys=True)
    if hasattr(module, "report"):
        print(module.report(metrics))
    return out, metrics_path
