"""The viewer's web app (Flask): the run's overview, a table's rows page by page, one row in full,
and what each dataset is looked at for: selfmoe's domains with every drop and its reason,
pruned-synth's accuracy against epsilon and its kept/flipped mix, a concretizer frame from above,
a multiui page on desktop and mobile with curation's verdict, an rmaxts search tree.

Untrusted text (page titles, accessibility trees, model output, Lean code) is only ever a Jinja
value, which Jinja escapes; no template marks anything safe, no page carries a script, and every
response sends a Content-Security-Policy that forbids scripts, frames and foreign sources, so a
value that escaped the escaping would still not run. Images are served only when their bytes are
PNG, JPEG or WebP, with `nosniff`. Pictures (gallery.py) are made by the app from the rows when first
asked for and kept, one drawing at a time; a trainer's own figures are served only from the names it
writes beside the data.
"""
from __future__ import annotations

import collections
import functools
import json
import os
import threading

from flask import Flask, Response, abort, render_template, request

from core.dataset_folder import read_manifest
from pipelines.viewer import gallery, pictures, views
from pipelines.viewer.tables import Table, as_text, opener
from schemas import DEAD_LETTER, SchemaError
from schemas import get as schema_of

PAGE_ROWS = 25
CELL_CHARS = 120
CSP = ("default-src 'none'; img-src 'self'; style-src 'self'; form-action 'self'; base-uri 'none'; "
       "frame-ancestors 'none'")
IMAGE_MAGIC = {b"\x89PNG\r\n\x1a\n": "image/png", b"\xff\xd8\xff": "image/jpeg", b"RIFF": "image/webp"}
DEAD_TABLE = DEAD_LETTER.table


def make_app(dataset_dir: str) -> Flask:
    """The app over one published dataset (raises FileNotFoundError, with what to do, if it is not one)."""
    manifest = read_manifest(dataset_dir)
    app = Flask(__name__, template_folder=os.path.join(os.path.dirname(__file__), "templates"),
                static_folder=os.path.join(os.path.dirname(__file__), "static"))
    open_table = opener(dataset_dir, manifest)

    def table(name: str) -> Table:
        try:
            return open_table(name)
        except KeyError as exc:
            abort(404, exc.args[0])

    @functools.lru_cache(maxsize=1)
    def dead_letters() -> list[dict]:       # a published run does not change: read them once
        return _dead(table, manifest)

    draw_lock = threading.Lock()
    missing = pictures.missing()

    @functools.lru_cache(maxsize=128)
    def picture(name: str, number: int | None, view: str | None) -> bytes:
        with draw_lock:                     # one drawing at a time: matplotlib's font and text caches are shared
            return gallery.make(manifest["dataset"], table, dataset_dir, name, number, view)

    @app.after_request
    def headers(response: Response) -> Response:
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cross-Origin-Resource-Policy"] = "same-origin"
        return response

    @app.route("/")
    def overview():
        entries = []
        for name, entry in manifest["tables"].items():
            try:
                schema = schema_of(entry["schema"])
            except SchemaError:
                schema = None
            entries.append({"name": name, "entry": entry, "fields": schema.fields if schema else (),
                            "split_field": schema.split_field if schema else None})
        return render_template("overview.html", m=manifest, location=dataset_dir, tables=entries,
                               stages=_stages(manifest), config=_config(manifest), dead=dead_letters(),
                               look=_look(manifest, table, dataset_dir), missing=missing)

    @app.route("/t/<name>")
    def rows(name: str):
        t = table(name)
        column = request.args.get("column") or ""
        value = request.args.get("value")
        if column and column not in t.filter_columns:
            abort(400, f"{column!r} is not a filter column of {name} (filter by one of {t.filter_columns})")
        numbers = list(t.matching(column, value)) if column and value is not None else None
        total = len(numbers) if numbers is not None else t.rows
        pages = max(1, -(-total // PAGE_ROWS))
        page = min(max(1, request.args.get("page", 1, type=int)), pages)
        lo, hi = (page - 1) * PAGE_ROWS, min(page * PAGE_ROWS, total)
        shown = numbers[lo:hi] if numbers is not None else list(range(lo, hi))
        data = t.rows_at(shown) if numbers is not None else t.slice(lo, hi)
        cells = [[_cell(r.get(c)) for c in t.schema.names] for r in data]
        splits = manifest["tables"].get(name, {}).get("splits")
        menus = {c: [as_text(v) for v in t.values(c, splits)] for c in t.filter_columns}
        return render_template("table.html", name=name, columns=t.schema.names, rows=list(zip(shown, cells)),
                               page=page, pages=pages, total=total, column=column, value=value, menus=menus,
                               m=manifest, args={"column": column, "value": value} if column else {})

    @app.route("/t/<name>/<int:number>")
    def row(name: str, number: int):
        t = table(name)
        try:
            r = t.row(number)
        except IndexError as exc:
            abort(404, str(exc))
        docs = _docs(manifest, name)
        fields = [{"name": k, "doc": docs.get(k, ""), "text": _full(v), "image": _image_type(v) is not None}
                  for k, v in r.items()]
        dataset = manifest["dataset"]
        picture = _multiui_sample(table, r) if dataset == "multiui" and name == "samples" else None
        renders = _renders(table, number) if dataset == "multiui" and name == "pages" else None
        frame = None
        if dataset == "concretizer" and name == "frames":
            frame = {"views": views.frame_views(table, r), "labels": [lab["type"] for lab in r.get("labels") or []],
                     "trained": views.trained_frames(dataset_dir).get(r["id"], [])}
        tree_link = dataset == "rmaxts" and name == "problems"
        return render_template("row.html", name=name, number=number, fields=fields, rows=t.rows, m=manifest,
                               picture=picture, tree_link=tree_link, renders=renders, frame=frame, missing=missing)

    @app.route("/experiments")
    def experiments():
        """pruned-synth's experiments: accuracy against epsilon, and each one's kept/flipped mix."""
        if manifest["dataset"] != "pruned-synth":
            abort(404, "experiments with a kept/flipped mix are pruned-synth's")
        return render_template("experiments.html", m=manifest, mix=views.kept_flipped_mix(table),
                               trained=_trained_plot(dataset_dir), location=dataset_dir, missing=missing)

    @app.route("/selfmoe/<domain>")
    def domain(domain: str):
        """One domain's brainstormed instructions: kept ones with their responses, or the drops of
        one kind with each reason (and, for a near-duplicate, the instruction it matched)."""
        if manifest["dataset"] != "selfmoe":
            abort(404, "domains are selfmoe's")
        counts = next((d for d in views.selfmoe_domains(table) if d["domain"] == domain), None)
        if counts is None:
            abort(404, f"no domain {domain!r} in this dataset")
        show = request.args.get("show") or "kept"
        if show not in ("kept", "dropped", "seed", *counts["dropped"]):
            abort(400, f"show one of kept, dropped, seed, {', '.join(counts['dropped'])}; not {show!r}")
        numbers = views.selfmoe_numbers(table, domain, show)
        pages = max(1, -(-len(numbers) // PAGE_ROWS))
        page = min(max(1, request.args.get("page", 1, type=int)), pages)
        shown = numbers[(page - 1) * PAGE_ROWS: page * PAGE_ROWS]
        found = [views.selfmoe_row(r) for r in table("examples").rows_at(shown)]
        return render_template("domain.html", m=manifest, domain=domain, counts=counts, show=show,
                               rows=list(zip(shown, found)), page=page, pages=pages, total=len(numbers))

    @app.route("/pictures/<name>.png")
    @app.route("/pictures/<name>/<int:number>.png")
    @app.route("/pictures/<name>/<int:number>/<view>.png")
    def picture_png(name: str, number: int | None = None, view: str | None = None):
        """A picture of the data (gallery.py), drawn on the first request and then kept."""
        if missing:
            abort(404, f"pictures need {', '.join(missing)}: pip install 'shardsmith[train]'")
        try:
            return Response(picture(name, number, view), mimetype="image/png")
        except LookupError as exc:
            abort(404, str(exc))

    @app.route("/trained/<path:name>")
    def trained(name: str):
        """A figure `shardsmith train` wrote beside the data: accuracy.png (pruned-synth) or
        LAYER/bev.png (concretizer: original, restored and baseline of one frame); nothing else."""
        folder = views.train_dir(dataset_dir)
        allowed = {"accuracy.png"} if manifest["dataset"] == "pruned-synth" else {
            f"{layer}/bev.png" for layers in views.trained_frames(dataset_dir).values() for layer in layers}
        path = os.path.join(folder, name) if folder and name in allowed else None
        if path is None or not os.path.isfile(path):
            abort(404, f"no trained figure {name!r} beside this dataset (run `shardsmith train {manifest['dataset']}`)")
        with open(path, "rb") as fh:
            data = fh.read()
        if _image_type(data) != "image/png":
            abort(404, f"{name} is not a PNG")
        return Response(data, mimetype="image/png")

    @app.route("/rmaxts/tree/<int:number>")
    def tree(number: int):
        """One problem's search tree: the tactic states, their visits and values, the proof's path."""
        if manifest["dataset"] != "rmaxts":
            abort(404, "search trees are rmaxts's")
        problems = table("problems")
        if not 0 <= number < problems.rows:
            abort(404, f"problems has {problems.rows} rows; there is no row {number}")
        problem, nodes, attempts = views.search(table, number)
        return render_template("tree.html", m=manifest, number=number, problem=problem,
                               roots=_tree(nodes, problem.get("proof") or ""), nodes=len(nodes),
                               attempts=attempts, missing=missing)

    @app.route("/t/<name>/<int:number>/<field>")
    def image(name: str, number: int, field: str):
        t = table(name)
        if not 0 <= number < t.rows:
            abort(404, f"{name} has {t.rows} rows; there is no row {number}")
        r = t.row(number)
        kind = _image_type(r.get(field))
        if kind is None:
            abort(404, f"{name} row {number}: {field!r} holds no image")
        return Response(r[field], mimetype=kind)

    @app.errorhandler(400)
    @app.errorhandler(404)
    def error(exc):
        return render_template("error.html", message=exc.description, m=manifest), exc.code

    app.config["DATASET_DIR"] = dataset_dir
    for name in app.jinja_env.list_templates():    # compiled once, at start, not by the first visitor
        app.jinja_env.get_template(name)
    return app


def _multiui_sample(table, sample: dict) -> dict | None:
    """A multiui sample as a person checks it: its page's screenshot with the sample's box drawn
    (an SVG rectangle over the image, so the box is an element a test can count), the turns beside."""
    pages = table("pages")
    found = pages.matching("id", sample["page_id"])
    if not found:
        return None
    page = pages.row(found[0])
    width, height = page["screenshot_width"], page["screenshot_height"]
    boxes = []
    if sample.get("bbox"):
        left, top, right, bottom = sample["bbox"]
        boxes.append((left * width, top * height, (right - left) * width, (bottom - top) * height))
    turns = [(t.get("from", ""), t.get("value", "")) for t in sample.get("conversations") or []]
    return {"page": found[0], "width": width, "height": height, "boxes": boxes, "turns": turns,
            "stroke": max(2, round(width / 300))}


def _renders(table, number: int) -> list[dict]:
    """A multiui page and its renders on the other platform: row, platform, viewport, verdict."""
    return [{"number": n, "platform": p["platform"], "viewport": f"{p['viewport_width']}x{p['viewport_height']}",
             "kept": p["kept"], "verdict": views.verdict(p), "screenshot": p["screenshot"] is not None}
            for n, p in views.page_renders(table, number)]


def _look(manifest: dict, table, dataset_dir: str) -> dict | None:
    """The overview's dataset section: pruned-synth's accuracy plot (the counts behind its mix read a
    whole table: they are on /experiments), selfmoe's domains (a few columns of a small table)."""
    if manifest["dataset"] == "pruned-synth" and "rows" in manifest["tables"]:
        return {"trained": _trained_plot(dataset_dir)}
    if manifest["dataset"] == "selfmoe" and "examples" in manifest["tables"]:
        return {"domains": views.selfmoe_domains(table)}
    return None


def _trained_plot(dataset_dir: str) -> bool:
    folder = views.train_dir(dataset_dir)
    return bool(folder) and os.path.isfile(os.path.join(folder, "accuracy.png"))


def _tree(nodes: list[dict], proof: str) -> list[dict]:
    """Nodes as nested dicts under their parents, ordered by visits; `on_proof` marks the states
    one of whose prefixes starts the problem's proof."""
    by_parent: dict = collections.defaultdict(list)
    for node in nodes:
        by_parent[node["parent_id"]].append(node)

    def grow(node: dict) -> dict:
        children = sorted(by_parent.get(node["id"], []), key=lambda n: (-n["visits"], n["id"]))
        return dict(node, children=[grow(c) for c in children], on_proof=views.on_proof(node, proof))
    ids = {n["id"] for n in nodes}
    return [grow(n) for n in nodes if n["parent_id"] is None or n["parent_id"] not in ids]


def _config(manifest: dict) -> list[tuple[str, str, bool]]:
    swept = set(manifest.get("swept") or ())
    return [(k, json.dumps(v), k in swept) for k, v in sorted((manifest.get("config") or {}).items())]


def _stages(manifest: dict) -> tuple[list[str], list[tuple[str, list]]]:
    """The funnel: one row per stage, the counters any stage has as columns."""
    stages = manifest.get("stages") or {}
    order = ["inputs", "outputs", "dead", "skipped", "reused", "computed", "busy_s", "span_s"]
    seen = {k for s in stages.values() for k in s}
    columns = [k for k in order if k in seen] + sorted(seen - set(order))
    return columns, [(name, [_counter(s.get(c)) for c in columns]) for name, s in stages.items()]


def _counter(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return "" if value is None else str(value)


def _dead(table, manifest: dict) -> list[dict]:
    """Dead letters grouped by stage and error type, with a few excerpts each."""
    if not (manifest.get("dead_letters") or {}).get("count"):
        return []
    t = table(DEAD_TABLE)
    groups: dict = collections.OrderedDict()
    for start in range(0, t.rows, 1000):
        for r in t.slice(start, start + 1000):
            g = groups.setdefault((r.get("stage"), r.get("error_type")), {"count": 0, "examples": []})
            g["count"] += 1
            if len(g["examples"]) < 3:
                g["examples"].append({"message": _cell(r.get("message"), 300), "excerpt": _cell(r.get("excerpt"), 300)})
    return [{"stage": s, "error_type": e, **g} for (s, e), g in groups.items()]


def _docs(manifest: dict, name: str) -> dict[str, str]:
    try:
        schema = DEAD_LETTER if name == DEAD_TABLE else schema_of(manifest["tables"][name]["schema"])
    except (SchemaError, KeyError):
        return {}
    return {f.name: f.doc for f in schema.fields}


def _image_type(value) -> str | None:
    if isinstance(value, (bytes, bytearray)):
        for magic, kind in IMAGE_MAGIC.items():
            if bytes(value[:len(magic)]) == magic:
                return kind
    return None


def _cell(value, width: int = CELL_CHARS) -> str:
    text = _full(value)
    return text if len(text) <= width else text[:width - 1] + "…"


def _full(value) -> str:
    if isinstance(value, (bytes, bytearray)):
        kind = _image_type(value)
        return f"<{kind or 'binary'}, {len(value)} bytes>"
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)
