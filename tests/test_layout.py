"""The house layout (docs/architecture.md): imports flow one way, and every dataset's graph is named and
placed by one rule.

    pipelines -> transforms -> core -> schemas
    trainers  ---------------> core -> schemas

- schemas/ holds table schemas and the manifest format: it imports only pyarrow, yaml and the
  standard library, so anything may depend on it;
- core/ is the Beam-free layer both sides share (object-store I/O, the codec, config keys, the
  voxel backbone network): it imports no Beam, transform, pipeline or trainer;
- transforms/ never imports a pipeline or a trainer;
- trainers/ import no Beam, transform or pipeline, so a trainer runs on a GPU box without the
  pipeline's dependencies;
- pipelines/ wire everything (the CLI dispatches to trainers too).

Imports are read with `ast`, not by importing, so a violation hidden behind a lazy import inside a
function is caught too.
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import sys
from pathlib import Path

import apache_beam as beam
import pytest

from pipelines.registry import datasets

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("schemas", "core", "transforms", "pipelines", "trainers")
# what a package may not import
FORBIDDEN = {"core": {"apache_beam", "transforms", "pipelines", "trainers"},
             "transforms": {"pipelines", "trainers"},
             "trainers": {"apache_beam", "transforms", "pipelines"}}
# what schemas may import: nothing but these and the standard library
SCHEMAS_MAY_IMPORT = {"schemas", "pyarrow", "yaml", "__future__"}


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
           if name.split(".")[0] in FORBIDDEN[package]]
    assert not bad, f"{package} may not import {sorted(FORBIDDEN[package])}:\n" + "\n".join(bad)


def test_schemas_import_only_pyarrow_yaml_and_the_standard_library():
    bad = [f"{path.relative_to(ROOT)} imports {name}"
           for path in _files("schemas") for name in sorted(_imported(path))
           if name.split(".")[0] not in SCHEMAS_MAY_IMPORT | set(sys.stdlib_module_names)]
    assert not bad, "schemas/ holds table schemas and the manifest format only:\n" + "\n".join(bad)


def test_core_loads_no_beam():
    """A trainer on a GPU box imports the whole shared layer without Beam or any transform."""
    import json
    import subprocess
    modules = sorted(f"core.{p.stem}" for p in _files("core") if p.stem != "__init__")
    code = ("import json, sys; import " + ", ".join(modules) + "; print(json.dumps("
            "sorted(m for m in sys.modules if m.split('.')[0] in ('apache_beam', 'transforms', 'pipelines', "
            "'trainers'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []


# the project modules that may be imported inside a function: each needs an optional extra's package
# at its top, so importing it at the top of its user would make that extra a must for every command
# (`shardsmith list` with no torch, spconv or pillow installed). The registry's import of the
# dataset modules is the one other lazy boundary (pipelines/registry.py).
LAZY_FOR_AN_EXTRA = {"core.voxel_backbone": {"torch", "spconv"},          # lidar
                     "trainers.distributed": {"torch"},                     # train
                     "transforms.web.tasks.draw": {"PIL"}}                  # web


def _top_level_imports(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Try):   # `try: import spconv ... except ImportError: raise ...`
            names |= _top_level_imports(ast.Module(body=node.body, type_ignores=[]))
    return names


def test_project_imports_sit_at_the_top():
    """A module's header says what it uses: a project import inside a function is allowed only for a
    module that needs an optional extra (LAZY_FOR_AN_EXTRA), and each of those really does."""
    inside = []
    for package in PACKAGES:
        for path in _files(package):
            tree = ast.parse(path.read_text(), str(path))
            for func in ast.walk(tree):
                if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(func):
                    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                        names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                    elif isinstance(node, ast.Import):
                        names = [a.name for a in node.names]
                    else:
                        continue
                    project = [n for n in names if n.split(".")[0] in PACKAGES]
                    if project and not any(n in LAZY_FOR_AN_EXTRA for n in project):
                        inside.append(f"{path.relative_to(ROOT)}:{node.lineno} ({func.name}) imports {project[0]}")
    assert not inside, "move these imports to the top of their files:\n" + "\n".join(inside)
    for module, extras in LAZY_FOR_AN_EXTRA.items():
        path = ROOT / (module.replace(".", "/") + ".py")
        top = {name.split(".")[0] for name in _top_level_imports(ast.parse(path.read_text()))}
        assert top & extras, f"{module} no longer imports {sorted(extras)} at its top: import it at the top of its users"


def test_every_package_is_in_the_layout():
    """A new top-level package needs a place in the rules above."""
    found = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench"}
    assert found == set(PACKAGES), found


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


@pytest.mark.parametrize("name", sorted(datasets()))
def test_every_registered_trainer_resolves(name):
    """`shardsmith train` finds each trainer by "module:function": a moved module fails here, not on a user."""
    dataset = datasets()[name]
    for ref in [dataset.trainer, *dataset.trainers.values()]:
        module, _, function = ref.partition(":")
        assert module.startswith("trainers.") and callable(getattr(importlib.import_module(module), function, None)), ref
