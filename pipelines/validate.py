"""`shardsmith validate` and `shardsmith inspect`: read a dataset back and check it."""
from __future__ import annotations

import json
import posixpath
import re

import pyarrow.parquet as pq

import schemas
from core import storage
from schemas import SchemaError
from schemas.manifest import ManifestError, inside_path
from transforms.io import layout

PART = re.compile(r"part-(\d{5})-of-(\d{5})\.parquet$")


def _tables(manifest: dict) -> dict[str, dict]:
    tables = dict(manifest.get("tables", {}))
    tables[layout.DEAD_LETTER_DIR] = manifest.get("dead_letters", {})
    return tables


def _schema_of(entry: dict):
    return schemas.get(entry["schema"])


def validate(path: str) -> tuple[list[str], list[str]]:
    """(problems, report lines). Checks every file against its schema and the manifest's counts.

    Only what the manifest lists is the dataset: an unlisted Parquet file inside a listed folder
    is a problem; other runs' generation folders (a crashed or concurrent run) are only reported."""
    storage.check_readable(path)
    manifest = layout.read_manifest(path)
    problems, report, listed = [], [], set()
    if manifest.get("format") != layout.MANIFEST_FORMAT:
        problems.append(f"manifest format {manifest.get('format')!r}, expected {layout.MANIFEST_FORMAT!r}")
    for table, entry in _tables(manifest).items():
        line = _check_table(path, table, entry, problems, listed)
        if line:
            report.append(line)
    report += _check_unlisted(path, listed, problems)
    return problems, report


def _check_table(path: str, table: str, entry: dict, problems: list, listed: set) -> str | None:
    """One table's files against its schema and the manifest's counts; its report line, or None when
    its schema is unknown here."""
    try:
        schema = _schema_of(entry)
    except (SchemaError, KeyError) as exc:
        problems.append(f"{table}: unknown schema ({exc})")
        return None
    if entry.get("version") != schema.version:
        problems.append(f"{table}: manifest says {schema.name} v{entry.get('version')}, "
                        f"this shardsmith knows v{schema.version}")
        return None
    if "fingerprint" in entry and entry["fingerprint"] != schema.fingerprint:
        problems.append(f"{table}: schema fingerprint {entry['fingerprint']} differs from "
                        f"{schema.fingerprint} at the same version")
    total, splits, ids = 0, {}, set()
    files = entry.get("files", [])
    counts = {PART.search(f["path"]).group(2) if PART.search(f["path"]) else None for f in files}
    if counts != {f"{len(files):05d}"}:
        problems.append(f"{table}: part names do not form part-i-of-{len(files):05d}")
    for f in files:
        total += _check_part(path, f, schema, ids, splits, problems, listed)
    expected_total = entry.get("rows", entry.get("count"))
    if total != expected_total:
        problems.append(f"{table}: {total} rows in files, manifest says {expected_total}")
    expected_splits = entry.get("splits", entry.get("by_stage"))
    if schema.split_field and expected_splits is not None and splits != expected_splits:
        problems.append(f"{table}: rows per {schema.split_field} {splits}, manifest says {expected_splits}")
    return f"{table:14s} {schema.name} v{schema.version}: {total:,} rows in {len(files)} file(s)"


def _check_part(path: str, f: dict, schema, ids: set, splits: dict, problems: list, listed: set) -> int:
    """One listed part: inside the folder, present, Parquet of the schema, its rows as listed, no id
    seen before; adds its ids and split counts, returns its rows (0 where it cannot be read)."""
    try:
        inside_path(f["path"], "")
    except ManifestError:
        problems.append(f"{f['path']!r}: listed in the manifest, but no path inside the dataset folder")
        return 0
    listed.add(posixpath.normpath(f["path"]))
    fp = storage.join(path, f["path"])
    if not storage.is_file(fp):
        problems.append(f"{f['path']}: listed in the manifest but missing")
        return 0
    try:
        pf = pq.ParquetFile(storage.open_input(fp))
        schema.check_file_schema(pf.schema_arrow)
    except SchemaError as exc:
        problems.append(f"{f['path']}: {exc}")
        return 0
    except Exception as exc:  # a truncated or foreign file
        problems.append(f"{f['path']}: not readable as Parquet ({exc})")
        return 0
    rows = pf.metadata.num_rows
    if rows != f["rows"]:
        problems.append(f"{f['path']}: {rows} rows, manifest says {f['rows']}")
    data = pf.read(columns=["id"] + ([schema.split_field] if schema.split_field else []))
    file_ids = data.column("id").to_pylist()
    if len(set(file_ids)) != len(file_ids) or ids.intersection(file_ids):
        problems.append(f"{f['path']}: duplicate ids")
    ids.update(file_ids)
    if schema.split_field:
        for value in data.column(schema.split_field).to_pylist():
            splits[value] = splits.get(value, 0) + 1
    return rows


def _check_unlisted(path: str, listed: set, problems: list) -> list[str]:
    """A Parquet file of the listed generations that the manifest does not list is a problem; other
    runs' generation folders are reported only (report lines)."""
    generations = {layout.generation_of(p) for p in listed}
    others: dict[str, int] = {}
    for rel, _ in storage.list_files(path):
        if not rel.endswith(".parquet") or rel in listed:
            continue
        gen = layout.generation_of(rel)
        if gen is not None and gen not in generations:
            others[gen] = others.get(gen, 0) + 1
        else:
            problems.append(f"{rel}: a Parquet file the manifest does not list")
    return [f"(not part of the dataset: {n} Parquet file(s) of another run in {gen}/)"
            for gen, n in sorted(others.items())]


def inspect(path: str, rows: int = 3) -> str:
    """A readable summary: where the data came from, each table's schema, counts and first rows."""
    manifest = layout.read_manifest(path)
    out = [f"{manifest['dataset']} at {path}", f"  made by {manifest.get('code_version')} on "
           f"{manifest.get('runner')} at {manifest.get('created')}; {manifest.get('experiments')} experiment(s)"]
    if manifest.get("swept"):
        out.append(f"  swept: {', '.join(manifest['swept'])}")
    out.append("  config: " + json.dumps(manifest.get("config"), sort_keys=True))
    for table, entry in _tables(manifest).items():
        schema = _schema_of(entry)
        count = entry.get("rows", entry.get("count", 0))
        splits = entry.get("splits") or entry.get("by_stage") or {}
        out.append(f"\n[{table}] {schema.name} v{schema.version}: {count:,} rows"
                   + (f" ({', '.join(f'{k} {v}' for k, v in splits.items())})" if splits else ""))
        out.append(f"  {schema.doc}")
        for f in schema.fields:
            out.append(f"  {f.name:12s} {str(f.type):22s} {f.doc}")
        shown = 0
        for f in entry.get("files", []):
            if shown >= rows:
                break
            pf = pq.ParquetFile(storage.open_input(storage.join(path, inside_path(f["path"], path))))
            table_rows = next(pf.iter_batches(batch_size=rows - shown)).to_pylist() if pf.metadata.num_rows else []
            for row in table_rows:
                out.append("  - " + _short(row))
                shown += 1
    return "\n".join(out)


def _short(row: dict, width: int = 160) -> str:
    parts = []
    for key, value in row.items():
        if isinstance(value, list) and len(value) > 4:
            value = "[" + ", ".join(f"{v:.3g}" if isinstance(v, float) else repr(v) for v in value[:4]) + f", ... ({len(value)})]"
        text = f"{key}={value}"
        parts.append(text if len(text) < 80 else text[:77] + "...")
    line = " ".join(parts)
    return line if len(line) <= width else line[:width - 3] + "..."
