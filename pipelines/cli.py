"""The `shardsmith` command: list, run, status, validate, inspect, view, export, train, cache.

Every user mistake (unknown dataset or key, bad value, missing file) prints
one line and exits 2; a run that fails its error budget or a dataset that
fails validation exits 1.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from core import storage
from core.config import ConfigError
from core.dataset_folder import read_manifest
from pipelines import logs, registry, run, status
from pipelines.export import JSON_NAME, export
from pipelines.run import DEFAULT_MAX_ERROR_RATE
from pipelines.runners import RUNNERS
from pipelines.train import train
from pipelines.validate import inspect, validate
from pipelines.viewer import gallery, pictures
from pipelines.viewer.app import listen
from pipelines.viewer.hosts import is_loopback
from schemas.manifest import ManifestError
from transforms.io import result_store
from transforms.io.shards import PART_BYTES

EXIT_USAGE, EXIT_FAILED = 2, 1


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's default prints usage; we print one line
        raise ConfigError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="shardsmith", description="Produce the data of five ICLR 2025 papers as Parquet shards.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("list", help="the datasets, one line each")
    _run_arguments(sub.add_parser("run", help="run a dataset's pipeline"))
    _reading_arguments(sub)
    _writing_arguments(sub)
    return p


def _run_arguments(r: argparse.ArgumentParser) -> None:
    r.add_argument("dataset")
    r.add_argument("--out", default="out", help="output folder or store URL (s3://BUCKET/PREFIX, gs://...); "
                   "the dataset goes to OUT/DATASET (default ./out)")
    r.add_argument("--config", help="YAML file of key: value overrides")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one key; a list value like m=[100,1000] runs a grid")
    r.add_argument("--runner", default="local", help="one of: " + "; ".join(f"{k} ({v})" for k, v in RUNNERS.items()))
    r.add_argument("--overwrite", action="store_true", help="replace an existing OUT/DATASET")
    r.add_argument("--max-error-rate", type=float, default=DEFAULT_MAX_ERROR_RATE,
                   help="fail the run if any stage sends a larger share of its results to dead letters")
    r.add_argument("--part-mb", type=float, default=PART_BYTES / 2**20,
                   help="target payload per Parquet part file in MB; a table's part count follows its volume")
    r.add_argument("--no-resume", action="store_true", help="compute every stage; read and write no stored "
                   "results (the same as --set cache=)")
    r.add_argument("--show-config", action="store_true", help="print the dataset's keys and defaults, then exit")
    r.add_argument("--quiet", action="store_true", help="no live progress display on stderr (shown on a terminal "
                   "for the local, multiprocess and portable runners)")
    r.add_argument("--detach", action="store_true", help="submit the job and return with its generation's path: the "
                   "job publishes itself when it ends (dataflow, flink, or portable with --job_endpoint; "
                   "`shardsmith status OUT/DATASET` follows it)")


def _reading_arguments(sub) -> None:
    """The commands that read a dataset: status, validate, inspect, view."""
    st = sub.add_parser("status", help="a dataset's generations: published, running (each stage's counts), "
                        "failed, stale")
    st.add_argument("path", help="the dataset folder (OUT/DATASET) or its s3:// / gs:// prefix")
    v = sub.add_parser("validate", help="check shards against their schemas and the manifest")
    v.add_argument("path")
    i = sub.add_parser("inspect", help="schema, counts and a few rows of a dataset")
    i.add_argument("path")
    i.add_argument("--rows", type=int, default=3)
    i.add_argument("--png", default=None, help="datasets with images (multiui): write a picture of one sample "
                   "here (default: DATASET-SAMPLEID.png in the current folder)")
    i.add_argument("--sample", default=None, help="the sample id to picture (default: the first of --task)")
    i.add_argument("--task", default=None, help="picture a sample of this task")
    i.add_argument("--pictures", default=None, metavar="DIR", help="write the pictures `shardsmith view` shows as "
                   "PNG files into DIR: pruned-synth's accuracy against epsilon and kept/flipped mix, selfmoe's "
                   "domains, a concretizer frame from above, a multiui page on each platform, an rmaxts search tree")
    i.add_argument("--row", type=int, default=0, help="with --pictures: the row of a one-row picture (the "
                   "concretizer frame, multiui page or rmaxts problem; default 0)")
    w = sub.add_parser("view", help="browse a dataset in a local web app: the run, its stages and dead letters, "
                       "every table page by page")
    w.add_argument("path", help="the dataset folder (OUT/DATASET) or its s3:// / gs:// prefix")
    w.add_argument("--port", type=int, default=8765, help="port on --host (0: any free port)")
    w.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback: the data may "
                   "hold what crawled pages and models wrote; serve it elsewhere only on purpose)")
    w.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="another name the viewer answers to in the Host header (repeatable); by default only "
                   "the --host address and, on loopback, 127.0.0.1, localhost and [::1]")


def _writing_arguments(sub) -> None:
    """The commands that write from a dataset or the result store: export, cache, train."""
    e = sub.add_parser("export", help="write a dataset as its paper's training files (multiui: LLaVA JSON + images)")
    e.add_argument("dataset")
    e.add_argument("--data", required=True, help="the dataset folder (OUT/DATASET)")
    e.add_argument("--out", required=True, help="a local folder for the files")
    c = sub.add_parser("cache", help="what the result store holds, and pruning it")
    c.add_argument("action", choices=("stats", "prune"))
    c.add_argument("--cache", default=None, help="the store's root: a folder or an s3:// / gs:// prefix "
                   "(default ~/.cache/shardsmith, the `cache` key's default)")
    c.add_argument("--older-than", default=None, metavar="AGE",
                   help="prune: delete entries last written longer ago than AGE (30d, 12h, 45m, 90s)")
    t = sub.add_parser("train", help="train a dataset's model from its shards")
    t.add_argument("dataset")
    t.add_argument("--data", required=True, help="the dataset folder (OUT/DATASET)")
    t.add_argument("--out", default=None, help="where metrics and checkpoints go (default DATA-train, beside the data)")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    t.add_argument("--trainer", default=None, metavar="NAME", help="another of the dataset's trainers "
                   "(concretizer: backbone, the detector pre-training that makes weights= for the run)")
    t.add_argument("--nproc", type=int, default=1, help="data-parallel processes (DDP: gloo on CPU, nccl with one "
                   "GPU each on CUDA); under torchrun leave it out")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    beam_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, beam_args = argv[:cut], argv[cut + 1:]
    logs.configure()
    try:
        args = _parser().parse_args(argv)
        return _COMMANDS[args.command](args, beam_args)
    except ConfigError as exc:
        print(f"shardsmith: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (FileNotFoundError, storage.StorageError, ManifestError) as exc:
        print(f"shardsmith: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("shardsmith: interrupted", file=sys.stderr)
        return 130


def _list(args, beam_args) -> int:
    for name, ds in registry.datasets().items():
        print(f"{name:14s} {ds.summary}")
    return 0


def _run(args, beam_args) -> int:
    dataset = registry.get(args.dataset)
    if args.show_config:
        for k in dataset.config.keys:
            print(f"{k.name:16s} {k.default!r:>10}  {k.doc}")
        return 0
    try:
        manifest = run.run(dataset, out=args.out, config_file=args.config, sets=args.set,
                           runner=args.runner, overwrite=args.overwrite,
                           max_error_rate=args.max_error_rate, beam_args=beam_args, quiet=args.quiet,
                           part_mb=args.part_mb, resume=not args.no_resume, detach=args.detach)
    except run.RunFailed as exc:
        print(f"shardsmith: run failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.detach:
        print(f"{dataset.name}: submitted to the {args.runner} runner ({manifest['state'] or 'state unknown'}); "
              f"it writes {manifest['generation']} and publishes itself when it ends. Follow it with "
              f"`shardsmith status {storage.join(args.out, dataset.name)}`")
        return 0
    print(summary(manifest, storage.join(args.out, dataset.name)))
    return 0


def summary(manifest: dict, path: str) -> str:
    lines = [f"{manifest['dataset']}: {manifest['experiments']} experiment(s) -> {path} "
             f"({manifest['runner']} runner, {manifest['wall_time_s']['total']:.1f} s)"]
    for table, t in manifest["tables"].items():
        splits = ", ".join(f"{k} {v}" for k, v in t["splits"].items())
        lines.append(f"  {table:14s} {t['rows']:>10,} rows in {len(t['files'])} file(s)" + (f"  ({splits})" if splits else ""))
    dl = manifest["dead_letters"]
    lines.append(f"  {'dead letters':14s} {dl['count']:>10,}" + (
        "  (" + ", ".join(f"{k} {v}" for k, v in dl["by_stage"].items()) + ")" if dl["count"] else ""))
    width = max([14] + [len(name) for name in manifest["stages"]]
                + [len("write " + table) for table in manifest.get("sink") or {}])
    lines.append(f"  {'stage':{width}s}   inputs    outputs   dead   busy s    cpu s   wall s")
    for name, s in manifest["stages"].items():
        lines.append(f"  {name:{width}s} {s['inputs']:>8,} {s['outputs']:>10,} {s['dead']:>6,} {s['busy_s']:>8.2f} "
                     f"{s.get('cpu_s', 0.0):>8.2f} {s['span_s']:>8.2f}")
        notes = ["skipped: " + ", ".join(f"{k} {v}" for k, v in s["skipped"].items())] if s.get("skipped") else []
        notes += [f"retried {s['retries']} transient fault(s)"] if s.get("retries") else []
        notes += [f"reused {s['reused']} stored result(s), computed {s['computed']}"] if "reused" in s else []
        if notes:
            lines.append(" " * (width + 4) + "; ".join(notes))
    for table, w in (manifest.get("sink") or {}).items():
        lines.append(f"  {'write ' + table:{width}s} {w['parts']:>8,} {w['rows']:>10,} {'':>6s} {w['busy_s']:>8.2f} "
                     f"{w['cpu_s']:>8.2f}   {w['bytes_written'] / 2**20:,.1f} MB written")
    if manifest.get("stale_generations_removed"):
        lines.append(f"  removed {len(manifest['stale_generations_removed'])} folder(s) left by killed runs: "
                     + ", ".join(manifest["stale_generations_removed"]))
    return "\n".join(lines)


def _cache(args, beam_args) -> int:
    root = args.cache or result_store.DEFAULT_ROOT
    storage.check_readable(root)
    if args.cache and not storage.is_dir(root):
        raise ConfigError(f"--cache {root!r}: no result store there (a wrong path, or nothing stored yet)")
    if args.action == "prune":
        if args.older_than is None:
            raise ConfigError("cache prune needs --older-than AGE, e.g. --older-than 30d")
        try:
            age = result_store.parse_age(args.older_than)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        removed, freed = result_store.prune(root, age)
        print(f"{root}: removed {removed:,} entries ({freed / 2**20:,.1f} MiB) older than {args.older_than}")
        return 0
    rows = result_store.stats(root)
    if not rows:
        print(f"{root}: empty")
        return 0
    width = max(len(r.namespace) for r in rows)
    print(f"{'namespace':{width}s}  {'entries':>9s}  {'MiB':>9s}  oldest               newest")
    for r in rows:
        print(f"{r.namespace:{width}s}  {r.entries:>9,}  {r.bytes / 2**20:>9,.1f}  {_when(r.oldest)}  {_when(r.newest)}")
    print(f"{'total':{width}s}  {sum(r.entries for r in rows):>9,}  {sum(r.bytes for r in rows) / 2**20:>9,.1f}")
    return 0


def _when(epoch: float) -> str:
    import datetime
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _status(args, beam_args) -> int:
    storage.check_readable(args.path)
    if not storage.is_dir(args.path):
        raise ConfigError(f"{args.path}: no such dataset folder (give OUT/DATASET, as `shardsmith run` wrote it)")
    for line in status.report(args.path):
        print(line)
    return 0


def _validate(args, beam_args) -> int:
    problems, report = validate(args.path)
    for line in report:
        print(line)
    if problems:
        for p in problems:
            print(f"shardsmith: invalid: {p}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{args.path}: valid")
    return 0


def _inspect(args, beam_args) -> int:
    print(inspect(args.path, rows=args.rows))
    dataset = registry.get(read_manifest(args.path)["dataset"])
    picture = dataset.picture(args.path, args.png, sample_id=args.sample, task=args.task)
    if picture:
        print("\npicture: " + picture)
    if args.pictures is not None:
        if pictures.missing():
            raise ConfigError(f"--pictures needs {', '.join(pictures.missing())}: pip install 'shardsmith[train]'")
        try:
            written = gallery.write(args.path, args.pictures, row=args.row)
        except LookupError as exc:
            raise ConfigError(str(exc)) from None
        print("\n" + "\n".join(f"picture: {path}" for path in written))
    return 0


def _view(args, beam_args) -> int:
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port}: a port is 0 to 65535 (0 takes any free one)")
    try:
        server = listen(args.path, args.host, args.port, args.allow_host)
    except FileNotFoundError:               # no dataset there: main says so in one line
        raise
    except OSError as exc:
        raise ConfigError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}; "
                          "pick another --port (0 takes any free one)") from None
    if not is_loopback(args.host):
        print(f"warning: listening on {args.host}, beyond loopback: whoever reaches it can read this dataset "
              "(its pages and model outputs included)", file=sys.stderr, flush=True)
    print(f"viewing {args.path} at http://{args.host}:{server.server_port}/  (Ctrl-C stops)", flush=True)
    server.serve_forever()
    return 0


def _export(args, beam_args) -> int:
    t0 = time.time()
    counts = export(args.dataset, args.data, args.out)
    skipped = {k: v for k, v in counts.items() if k.startswith("skipped")}
    print(f"exported {counts.get('samples', 0):,} samples over {counts.get('pages', 0):,} page screenshots "
          f"({counts.get('marked', 0):,} pictures with a drawn box) in {time.time() - t0:.1f} s -> "
          f"{os.path.join(args.out, JSON_NAME)}" + (f"; {skipped}" if skipped else ""))
    return 0


def _train(args, beam_args) -> int:
    dataset = registry.get(args.dataset)
    t0 = time.time()
    out, metrics_path = train(dataset, args.data, args.out, args.set, nproc=args.nproc, trainer=args.trainer)
    if metrics_path:                 # rank 0 (under torchrun the others say nothing)
        print(f"trained {dataset.name} in {time.time() - t0:.1f} s -> {out} (metrics: {metrics_path})")
    return 0


_COMMANDS = {"list": _list, "run": _run, "validate": _validate, "inspect": _inspect, "view": _view, "export": _export,
             "train": _train, "cache": _cache, "status": _status}

if __name__ == "__main__":
    sys.exit(main())
