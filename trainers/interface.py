"""What `shardsmith train` needs of a trainer: the interface a dataset's `trainer` names.

A dataset names its trainer as "module:function" (pipelines.dataset.Dataset.trainer), imported only
when training, so that running a pipeline never imports torch. The module holds:

    CONFIG          a core.config.ConfigSpec: the trainer's keys (`--set KEY=VALUE`)
    <function>      train(data_dir, out_dir, config) -> metrics dict (written to metrics.json)
    DATA_PARALLEL   optional, default True: False for a trainer that runs on one process only
    report          optional: report(metrics) -> the text printed after training

How a trainer trains is its own: the neural ones give trainers.fit.fit a Recipe (model, batches,
loss, evaluation) and get checkpoints, resumption and data parallelism from the loop. Each resolves
`config` with trainers.fit.settings, then reads it through a frozen dataclass of its own (made by
core.config.settings_from) and hands the loop's keys to trainers.fit.Plan."""
from __future__ import annotations

from types import ModuleType

from core.config import ConfigError, ConfigSpec


def check(module: ModuleType, function: str, dataset: str) -> None:
    """ConfigError, in one line, naming what `module` lacks of the interface."""
    missing = []
    if not isinstance(getattr(module, "CONFIG", None), ConfigSpec):
        missing.append("CONFIG (a ConfigSpec)")
    if not callable(getattr(module, function, None)):
        missing.append(f"{function}(data_dir, out_dir, config)")
    if not isinstance(data_parallel(module), bool):
        missing.append("DATA_PARALLEL as a bool")
    if hasattr(module, "report") and not callable(module.report):
        missing.append("report(metrics) as a function")
    if missing:
        raise ConfigError(f"the {dataset} trainer {module.__name__} lacks {', '.join(missing)} "
                          "(trainers/interface.py)")


def data_parallel(module: ModuleType) -> bool:
    return getattr(module, "DATA_PARALLEL", True)


def report(module: ModuleType, metrics: dict) -> str | None:
    """The trainer's own summary of its metrics, or None (`check` has seen that it is a function)."""
    return module.report(metrics) if hasattr(module, "report") else None
