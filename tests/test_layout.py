"""The house layout (ARCHITECTURE.md): imports flow one way, and every dataset's graph is named and
placed by one rule.

Imports are read with `ast`, not by importing, so a violation hidden behind a lazy import inside a
function is caught too.
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import apache_beam as beam
import pytest

from pipelines.registry import datasets

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("schemas", "transforms", "pipelines", "trainers")
# what a package may not import (the house: pipelines -> transforms -> schemas; trainers -> schemas)
FORBIDDEN = {"schemas": {"transforms", "pipelines", "trainers"},
             "transforms": {"pipelines", "trainers"},
             "trainers": {"transforms", "pipelines"}}
# the one exception: the network the pipeline runs frozen and the detector pre-training trains
# (trainers/concretizer_detector.py); plain torch + spconv, no Beam (checked below)
SHARED_WITH_TRAINERS = {"transforms.lidar.backbone"}


def _imported(path: Path) -> set[str]:
    """The absolute module names a file imports, wherever in the file the import statement is."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _files(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_flow_one_way(package):
    bad = [f"{path.relative_to(ROOT)} imports {name}"
           for path in _files(package) for name in sorted(_imported(path))
           if name.split(".")[0] in FORBIDDEN[package]
           and not (package == "trainers" and name in SHARED_WITH_TRAINERS)]
    assert not bad, f"{package} may not import {sorted(FORBIDDEN[package])}:\n" + "\n".join(bad)


def test_what_trainers_share_with_transforms_loads_no_beam():
    """A trainer on a GPU box imports the shared network without Beam or any other transform."""
    import json
    import subprocess
    import sys
    code = ("import json, sys; import " + ", ".join(sorted(SHARED_WITH_TRAINERS)) + "; print(json.dumps("
            "sorted(m for m in sys.modules if m.split('.')[0] in ('apache_beam', 'transforms', 'pipelines'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out.strip().splitlines()[-1]))
    assert not {m for m in loaded if m.startswith(("apache_beam", "pipelines"))}, loaded
    assert loaded <= {"transforms", "transforms.lidar", "transforms.lidar.backbone", "transforms.lidar.occupancy"}, loaded


def _camel(dataset: str) -> str:
    return "".join(part.title() for part in re.split(r"[-_]", dataset))


def _snake(dataset: str) -> str:
    return dataset.replace("-", "_")


@pytest.mark.parametrize("name", sorted(datasets()))
def test_each_dataset_graph_follows_the_naming_rule(name):
    """pipelines/<dataset>.py builds `<Dataset>Graph(settings(resolved), ledger)`, where its
    `settings` makes a frozen `<Dataset>Settings`; both classes live in transforms/<domain>/<dataset>_graph.py."""
    snake, camel = _snake(name), _camel(name)
    graph_name, settings_name = f"{camel}Graph", f"{camel}Settings"
    pipeline = ROOT / "pipelines" / f"{snake}.py"
    modules = {m for m in _imported(pipeline) if re.fullmatch(rf"transforms\.\w+\.{snake}_graph", m)}
    assert len(modules) == 1, f"{pipeline.relative_to(ROOT)} must import its graph from transforms/<domain>/" \
                              f"{snake}_graph.py, found {sorted(modules) or 'none'}"
    (module_name,) = modules
    module = importlib.import_module(module_name)
    graph, settings = getattr(module, graph_name, None), getattr(module, settings_name, None)
    assert inspect.isclass(graph) and issubclass(graph, beam.PTransform), f"{module_name} lacks {graph_name}"
    assert inspect.isclass(settings) and dataclasses.is_dataclass(settings), f"{module_name} lacks {settings_name}"
    assert settings.__dataclass_params__.frozen, f"{settings_name} must be a frozen dataclass"
    assert list(inspect.signature(graph.__init__).parameters) == ["self", "settings", "ledger"], \
        f"{graph_name} is built from its settings and the ledger only"
    assert callable(getattr(importlib.import_module(f"pipelines.{snake}"), "settings", None)), \
        f"pipelines/{snake}.py makes the graph's settings in one function, settings(resolved)"
    graphs = [p.relative_to(ROOT) for p in _files("transforms") if p.name == f"{snake}_graph.py"]
    assert len(graphs) == 1, f"one graph module per dataset, found {graphs}"
