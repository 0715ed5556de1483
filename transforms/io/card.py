"""The dataset card (`README.md`) beside `_manifest.json` (docs/architecture.md, contract 11).

A Hugging Face dataset card: YAML front matter whose `configs:` give one config per table with
that table's part files listed exactly, so `datasets.load_dataset(DATASET_DIR, TABLE)` reads that
table and nothing else (a folder-wide glob would merge tables, or pick up dead letters). The body
is the manifest in words: rows per table and split, stages, dead letters, config, inputs and their
licences, code version.

Everything comes from the manifest dict, never from the folder or a fixed layout: the manifest
is what makes a run visible (contract 5), and its file paths are relative to the dataset folder,
which is also what HF resolves `data_files` against.

Splits: parts are sharded by id, so every part mixes the values of a table's split column (real,
synthetic and test rows share files). HF splits are sets of files, so the only correct mapping
is all of a table's parts under one `train` split; the card names the split column to filter on.
"""
from __future__ import annotations

import json
import re

import yaml

import schemas

SPLIT = "train"  # HF's default split name: what `load_dataset(dir, table)` returns, as a DatasetDict

# Licences of the inputs bundled with the pipelines (from their READMEs), by the path fragment
# their manifest fingerprints carry: (fragment, HF licence id, where it comes from).
BUNDLED_LICENSES = (
    ("pipelines/samples/kitti/", "cc-by-nc-sa-3.0",
     "KITTI 3D object sample frame (Geiger et al., CVPR 2012), via OpenPCDet"),
    ("pipelines/samples/lean/", "mit", "miniF2F sample in DeepSeek-Prover-V1.5's format"),
    ("pipelines/sites/multiui/", "apache-2.0", "shardsmith's hand-written sample site"),
    ("pipelines/seeds/selfmoe/", "apache-2.0", "shardsmith's original seed examples"),
)
NOT_RECORDED = "not recorded"


def dataset_card(manifest: dict) -> str:
    """The README.md text for the dataset `manifest` describes (a finished or failed run)."""
    # keys in the order _manifest.json stores them, so the card is the same from memory or from disk
    manifest = json.loads(json.dumps(manifest, sort_keys=True))
    tables = manifest.get("tables", {})
    default = default_table(manifest)
    licences = input_licences(manifest.get("inputs") or {})
    meta: dict = {"pretty_name": manifest.get("dataset", "dataset")}
    known = sorted({lic for lic, _ in licences.values() if lic != NOT_RECORDED})
    if known and all(lic != NOT_RECORDED for lic, _ in licences.values()):
        meta["license"] = known[0] if len(known) == 1 else known
    meta["configs"] = [_config(name, entry, name == default) for name, entry in tables.items()
                       if entry.get("files")]
    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, default_flow_style=False)
    body = "\n".join(_body(manifest, default, licences))
    return f"---\n{front}---\n\n{body}\n"


def default_table(manifest: dict) -> str | None:
    """The table `load_dataset(dir)` gives without a config: the first of the dataset's schema
    registry order that has files (its main table, the same on every run), else the largest."""
    tables = {name: e for name, e in manifest.get("tables", {}).items() if e.get("files")}
    try:
        order = [s.table for s in schemas.tables(manifest.get("dataset", ""))]
    except schemas.SchemaError:
        order = []
    for name in order:
        if name in tables:
            return name
    return min(tables, key=lambda n: (-tables[n].get("rows", 0), n), default=None)


def input_licences(inputs: dict) -> dict[str, tuple[str, str]]:
    """{input name: (licence id or "not recorded", source)}: known only for bundled samples."""
    out = {}
    for name, fingerprint in inputs.items():
        path = str(fingerprint).rsplit(" sha256:", 1)[0].replace("\\", "/") + "/"
        out[name] = next(((lic, src) for frag, lic, src in BUNDLED_LICENSES if frag in path),
                         (NOT_RECORDED, ""))
    return out


def _config(name: str, entry: dict, default: bool) -> dict:
    config = {"config_name": name,
              "data_files": [{"split": SPLIT, "path": [_literal(f["path"]) for f in entry["files"]]}]}
    if default:
        config["default"] = True
    return config


def _literal(path: str) -> str:
    """`path` as a glob that matches only itself: HF resolves data_files with fsspec's glob."""
    return re.sub(r"([\[*?])", r"[\1]", path)


def _body(m: dict, default: str | None, licences: dict) -> list[str]:
    name = m.get("dataset", "dataset")
    tables = m.get("tables", {})
    out = [f"# {name}", "",
           f"A shardsmith dataset: Parquet parts described by `_manifest.json` beside this card "
           f"(format `{m.get('format', '?')}`). Only the files the manifest lists are the dataset.", ""]
    if m.get("failed"):
        out += [f"**This run failed and was not published:** {m['failed']}.", ""]
    out += ["## Loading", "",
            "One config per table; each holds all of that table's part files in one "
            f"`{SPLIT}` split.", "", "```python", "from datasets import load_dataset", ""]
    for table in tables:
        if tables[table].get("files"):
            out.append(f'{table} = load_dataset("path/to/{name}", "{table}", split="{SPLIT}")'
                       + ("  # the default config" if table == default else ""))
    out += ["```", "", "Parts are sharded by row id, so each part mixes the values of a table's split "
            "column (counted per table below): a split is a filter on that column, not a set of files"
            + _filter_example(default, tables.get(default, {})) + ".", ""]
    out += ["## Tables", "", "| table | rows | files | bytes | schema | version | fingerprint |",
            "|---|---:|---:|---:|---|---:|---|"]
    for table, e in tables.items():
        files = e.get("files", [])
        out.append(_row(table + (" (default)" if table == default else ""), e.get("rows", 0), len(files),
                        sum(f.get("bytes", 0) for f in files), e.get("schema", ""), e.get("version", ""),
                        e.get("fingerprint", "")))
    for table, e in tables.items():
        out += ["", f"### {table}", ""] + _table_detail(e)
    out += _stages_and_dead_letters(m) + _inputs(m, licences)
    out += ["", "## Config", ""]
    if m.get("swept"):
        out += [f"Swept keys: {', '.join(m['swept'])} ({m.get('experiments', '?')} experiments).", ""]
    out += ["```yaml", yaml.safe_dump(m.get("config", {}), sort_keys=True, allow_unicode=True).rstrip(),
            "```", "", "## Provenance", "",
            f"- code version: {m.get('code_version', NOT_RECORDED)}",
            f"- runner: {m.get('runner', NOT_RECORDED)}",
            f"- created: {m.get('created', NOT_RECORDED)}"]
    if m.get("wall_time_s"):
        out.append(f"- wall time (s): {json.dumps(m['wall_time_s'], sort_keys=True)}")
    return out


def _stages_and_dead_letters(m: dict) -> list[str]:
    """The card's Stages and Dead letters sections: what each stage took in, kept and dropped."""
    out: list[str] = []
    out += ["", "## Stages", ""]
    stages = m.get("stages", {})
    if stages:
        out += ["| stage | inputs | outputs | dead | skipped |", "|---|---:|---:|---:|---|"]
        for stage, s in stages.items():
            skipped = "; ".join(f"{k}: {v}" for k, v in (s.get("skipped") or {}).items()) or "0"
            out.append(_row(stage, s.get("inputs", 0), s.get("outputs", 0), s.get("dead", 0), skipped))
    else:
        out.append("No stage statistics recorded.")
    dead = m.get("dead_letters", {})
    out += ["", "## Dead letters", "",
            f"{dead.get('count', 0)} dead-letter rows: inputs a stage could not use, each kept with its id, "
            f"stage, error type, message and an excerpt of the input, in " +
            (", ".join(f"`{f['path']}`" for f in dead.get("files", [])) or "no files") + "."]
    if dead.get("by_stage"):
        out += ["", "| stage | dead letters |", "|---|---:|"]
        out += [_row(stage, n) for stage, n in dead["by_stage"].items()]
    return out


def _inputs(m: dict, licences: dict) -> list[str]:
    """The card's Inputs and licences section: each input file's fingerprint and licence."""
    out: list[str] = []
    out += ["", "## Inputs and licences", ""]
    inputs = m.get("inputs") or {}
    if inputs:
        out += ["| input | fingerprint | licence |", "|---|---|---|"]
        for key, fingerprint in inputs.items():
            lic, src = licences[key]
            out.append(_row(key, f"`{fingerprint}`", f"{lic} ({src})" if src else lic))
    else:
        out.append("No input files: every row is generated from the config below. "
                   f"Licence: {NOT_RECORDED}.")
    return out


def _split_field(e: dict) -> str | None:
    try:
        return schemas.get(e.get("schema", "")).split_field
    except schemas.SchemaError:
        return None


def _filter_example(table: str | None, e: dict) -> str:
    field, values = _split_field(e), list(e.get("splits", {}))
    if not (table and field and values):
        return ""
    return f', e.g. `{table}.filter(lambda r: r["{field}"] == {json.dumps(values[-1])})`'


def _table_detail(e: dict) -> list[str]:
    """Description, rows per split and fields of one table, from its schema where shardsmith knows it."""
    try:
        schema = schemas.get(e.get("schema", ""))
    except schemas.SchemaError:
        schema = None
    out = [schema.doc, ""] if schema and schema.doc else []
    if not e.get("files"):
        out += ["No part files: this table has no config.", ""]
    column = f"`{schema.split_field}`" if schema and schema.split_field else "split column"
    if e.get("splits"):
        out += [f"| {column} | rows |", "|---|---:|"] + [_row(k, v) for k, v in e["splits"].items()] + [""]
    if schema:
        out += ["| field | type | description |", "|---|---|---|"]
        out += [_row(f"`{f.name}`", f"`{f.type}`" + (" (nullable)" if f.nullable else ""), f.doc)
                for f in schema.fields]
    return out


def _row(*cells) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"
