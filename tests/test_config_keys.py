"""One declaration per config key: a key reaches the graph's settings by its name
(core.config.settings_from), so a settings field of the same name must not declare a second,
different default. A field that disagrees with its key is a default the user cannot see in
`shardsmith describe` and that no config changes."""
from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import sys
import typing

import pytest

from core.config import names, settings_from
from pipelines import registry

# each dataset's graph settings (pruned-synth's graph takes a list of experiments, not one record)
SETTINGS = {
    "selfmoe": "transforms.text.selfmoe_graph:SelfmoeSettings",
    "multiui": "transforms.web.multiui_graph:MultiuiSettings",
    "rmaxts": "transforms.lean.rmaxts_graph:RmaxtsSettings",
    "concretizer": "transforms.lidar.concretizer_graph:ConcretizerSettings",
}


def _load(ref: str) -> type:
    module, name = ref.split(":")
    return getattr(__import__(module, fromlist=[name]), name)


# same name, but the field holds what the key resolves to, so its default is a resolved one too
RESOLVED = {
    "Sampling": "a record every dataset shares: its defaults are plain greedy decoding, each dataset's keys set their own",
    "SelfmoeSettings.prompt_format": "chat or plain, what the key's auto resolves to",
    "MultiuiSettings.llm_pages": "the count the key's text resolves to",
    "MultiuiSettings.backend": "the backend object the key names",
    "FrameJob.layout": "the layout the key's None (from the preset) resolves to",
}


def _hints(cls: type) -> dict:
    """Field types, also those its module imports only for type checking."""
    module = sys.modules[cls.__module__]
    imported = {alias.asname or alias.name: node.module for node in ast.walk(ast.parse(inspect.getsource(module)))
                if isinstance(node, ast.ImportFrom) for alias in node.names}
    extra: dict = {}
    while True:
        try:
            return typing.get_type_hints(cls, localns=extra)
        except NameError as exc:
            if exc.name not in imported or exc.name in extra:
                raise
            extra[exc.name] = getattr(importlib.import_module(imported[exc.name]), exc.name)


def _records(cls: type, seen=None) -> list[type]:
    """`cls` and every dataclass its fields hold, however deep."""
    seen = seen if seen is not None else []
    if cls in seen:
        return seen
    seen.append(cls)
    for hint in _hints(cls).values():
        for kind in (hint, *typing.get_args(hint)):
            if dataclasses.is_dataclass(kind) and isinstance(kind, type):
                _records(kind, seen)
    return seen


def _default(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _same(field_default, key_default) -> bool:
    if isinstance(field_default, (tuple, frozenset)) and isinstance(key_default, str):  # a comma-separated list
        return field_default == type(field_default)(names(key_default))
    return field_default == key_default


@pytest.mark.parametrize("dataset", sorted(SETTINGS))
def test_a_settings_field_and_its_key_agree_on_the_default(dataset):
    keys = {k.name: k for k in registry.get(dataset).config.keys}
    records = _records(_load(SETTINGS[dataset]))
    checked, disagree = 0, []
    for record in records:
        for field in dataclasses.fields(record):
            key, default = keys.get(field.name), _default(field)
            if key is None or default is dataclasses.MISSING or {record.__name__, f"{record.__name__}.{field.name}"} & set(RESOLVED):
                continue
            checked += 1
            if not _same(default, key.default):
                disagree.append(f"{record.__name__}.{field.name} = {default!r}, key default {key.default!r}")
    assert not disagree, "declare the default once, on the Key:\n" + "\n".join(disagree)
    assert checked >= 1 and len(records) >= 2  # the walk reached the nested records


def test_settings_from_takes_fields_by_name_and_refuses_unknown_ones():
    @dataclasses.dataclass(frozen=True)
    class Search:
        budget: int = 16
        batch: int = 4
        note: str = "kept"

    made = settings_from(Search, {"budget": 7, "batch": 2, "unrelated": 1}, batch=3)
    assert made == Search(budget=7, batch=3, note="kept")
    with pytest.raises(TypeError, match="Search has no field budgets"):
        settings_from(Search, {}, budgets=1)


# each trainer's settings: what its code reads of its CONFIG; the loop's keys go to trainers.fit.Plan
TRAINER_SETTINGS = {
    "trainers.pruned_synth": "FitSettings",
    "trainers.multiui": "SftSettings",
    "trainers.rmaxts": "ProverSettings",
    "trainers.selfmoe.training": "SelfmoeSettings",
    "trainers.concretizer.pretraining": "PretrainingSettings",
    "trainers.concretizer.inversion": "InversionSettings",
}


@pytest.mark.parametrize("module", sorted(TRAINER_SETTINGS))
def test_a_trainers_settings_are_its_keys_with_their_types(module):
    """Every field is a key of the trainer's CONFIG, of the key's type (`| None` where the key may be
    unset), with no default of its own; every key is read by the settings or by the loop's Plan."""
    pytest.importorskip("torch")
    from trainers.fit import Plan
    trainer = importlib.import_module(module)
    cls = getattr(trainer, TRAINER_SETTINGS[module])
    keys = {k.name: k for k in trainer.CONFIG.keys}
    hints = _hints(cls)
    wrong = []
    for field in dataclasses.fields(cls):
        key = keys.get(field.name)
        if key is None:
            wrong.append(f"{field.name}: no such key")
            continue
        want = key.type if key.default is not None and not key.optional else typing.Optional[key.type]
        if hints[field.name] != want:
            wrong.append(f"{field.name}: {hints[field.name]}, the key's {want}")
        if _default(field) is not dataclasses.MISSING:
            wrong.append(f"{field.name}: a default of its own")
    assert cls.__dataclass_params__.frozen and not wrong, wrong
    unread = set(keys) - {f.name for f in dataclasses.fields(cls)} - {f.name for f in dataclasses.fields(Plan)}
    assert not unread, f"keys nothing reads: {sorted(unread)}"
    values = trainer.settings(trainer.CONFIG, {})
    assert dataclasses.asdict(settings_from(cls, values)).items() <= values.items()
