"""The viewer's web app (Flask): the run's overview, a table's rows page by page, one row in full,
and what the dataset's look (pipelines/viewer/look.py, one module per dataset) adds: selfmoe's
domains with every drop and its reason, pruned-synth's accuracy against epsilon and its kept/flipped
mix, a concretizer frame from above and in 3D, a multiui page on desktop and mobile with curation's
verdict, an rmaxts search tree. Nothing here names a dataset.

Untrusted text (page titles, accessibility trees, model output, Lean code) is only ever a Jinja
value, which Jinja escapes; no template marks anything safe or holds an inline script, and every
response sends a Content-Security-Policy that allows only the app's own script files (the 3D frame
view's, which reads data as JSON and sets text only as text) and no frames or foreign sources, so a
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
import time

from flask import Flask, Response, abort, render_template, request, url_for
from markupsafe import Markup
from werkzeug.exceptions import HTTPException

from core.dataset_folder import read_manifest, resolves_inside
from pipelines.viewer import gallery, hosts, order, pictures, search, stats, thumbnails
from pipelines.viewer.look import look_of, page_span, row_or_404, train_dir
from pipelines.viewer.memo import Memo
from pipelines.viewer.tables import Table, as_text, opener
from schemas import DEAD_LETTER, SchemaError
from schemas import get as schema_of
from transforms.web import image_size

CELL_CHARS = 120            # a cell's text shown at once; the rest opens under it (<details>)
CELL_MORE = 2000            # a cell's text a table page holds at most; the row's page has it all
CSP = ("default-src 'none'; script-src 'self'; connect-src 'self'; img-src 'self'; style-src 'self'; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
MAX_IMAGE_PIXELS = 100_000_000     # an image cell's header may claim more than any screenshot has: not served
IMAGE_MAGIC = {b"\x89PNG\r\n\x1a\n": "image/png", b"\xff\xd8\xff": "image/jpeg", b"RIFF": "image/webp"}
DEAD_TABLE = DEAD_LETTER.table


def make_app(dataset_dir: str) -> Flask:
    """The app over one published dataset (raises FileNotFoundError, with what to do, if it is not one).
    It answers the loopback names on any port until `listen` names its own (hosts.py)."""
    run = _Run(dataset_dir)
    app = Flask(__name__, template_folder=os.path.join(os.path.dirname(__file__), "templates"),
                static_folder=os.path.join(os.path.dirname(__file__), "static"))
    app.config.update(VIEW_HOSTS=None, DATASET_DIR=dataset_dir, GENERATION=run.manifest.get("generation"),
                      REPLACED=None)
    _guard(app)
    _table_pages(app, run)
    _search_pages(app, run)
    _picture_routes(app, run)
    thumbnails.add_route(app, run.table)
    _error_pages(app, run)
    run.look.routes(app, run.table, dataset_dir, run.manifest)
    app.jinja_env.finalize = visible                # every value shown: controls and bidi overrides made marks
    for name in app.jinja_env.list_templates():    # compiled once, at start, not by the first visitor
        app.jinja_env.get_template(name)
    return app


class _Run:
    """One published run as the app's pages read it: its manifest, tables, dead letters and pictures."""

    def __init__(self, dataset_dir: str):
        self.dataset_dir = dataset_dir
        self.manifest = read_manifest(dataset_dir)
        self.look = look_of(self.manifest["dataset"])
        self.missing = pictures.missing()
        self._open = opener(dataset_dir, self.manifest)
        self._draw_lock = threading.Lock()
        self.dead_letters = functools.lru_cache(maxsize=1)(self._dead_letters)   # a published run does not change
        self.picture = functools.lru_cache(maxsize=128)(self._picture)
        # costly answers, each computed once however many ask at once, keyed by the generation shown
        self.generation = self.manifest.get("generation")
        self._found = Memo(32)              # search matches: at most search.MAX_MATCHES row numbers each
        self._orders = Memo(4)              # sort orders: 8 bytes a row each
        self._stats = Memo(16)              # per-column statistics of a table

    def matches(self, t: Table, term: str) -> search.Found:
        return self._found.get((self.generation, t.name, term), lambda: search.find(t, term))

    def ordered(self, t: Table, column: str, direction: str):
        return self._orders.get((self.generation, t.name, column, direction), lambda: order.order(t, column, direction))

    def statistics(self, t: Table) -> list[stats.ColumnStats]:
        return self._stats.get((self.generation, t.name), lambda: stats.table_stats(t))

    def table(self, name: str) -> Table:
        try:
            return self._open(name)
        except KeyError as exc:
            abort(404, exc.args[0])
        except ValueError as exc:           # a listed file outside the run, no regular file, or no Parquet
            abort(403, str(exc))

    def _dead_letters(self) -> list[dict]:
        return _dead(self.table, self.manifest)

    def _picture(self, name: str, number: int | None, view: str | None) -> bytes:
        with self._draw_lock:               # one drawing at a time: matplotlib's font and text caches are shared
            return gallery.make(self.look, self.manifest["dataset"], self.table, self.dataset_dir, name, number,
                                view)


def _guard(app: Flask) -> None:
    """Only the names the viewer listens on (DNS rebinding), and headers that keep a page inert."""
    @app.before_request
    def known_host():
        why = hosts.refusal(request.headers.get("Host"), app.config["VIEW_HOSTS"])
        if why:
            abort(421, why)

    @app.after_request
    def headers(response: Response) -> Response:
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cross-Origin-Resource-Policy"] = "same-origin"
        return response


def _table_pages(app: Flask, run: _Run) -> None:
    """The overview, a table page by page and one row in full."""
    manifest, table = run.manifest, run.table

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
        return render_template("overview.html", m=manifest, location=run.dataset_dir, tables=entries,
                               stages=_stages(manifest), config=_config(manifest), dead=run.dead_letters(),
                               look=run.look.overview(table, run.dataset_dir, manifest), missing=run.missing)

    @app.route("/t/<name>")
    def rows(name: str):
        t = table(name)
        column, value, sort, direction, args = _listing_args(t, name)
        numbers = list(t.matching(column, value)) if column and value is not None else None
        if sort:
            ordered = run.ordered(t, sort, direction)
            numbers = ordered if numbers is None else order.among(ordered, tuple(numbers), t.rows)
        total = len(numbers) if numbers is not None else t.rows
        page, pages, lo, hi = page_span(request.args.get("page"), total)
        shown = [int(n) for n in numbers[lo:hi]] if numbers is not None else list(range(lo, hi))
        data = t.rows_at(shown) if numbers is not None else t.slice(lo, hi)
        cells = [[_cell_parts(r.get(c), c) for c in t.schema.names] for r in data]
        splits = manifest["tables"].get(name, {}).get("splits")
        menus = {c: [as_text(v) for v in t.values(c, splits)] for c in t.filter_columns}
        return render_template("table.html", name=name, columns=_headers(t, args), rows=list(zip(shown, cells)),
                               page=page, pages=pages, total=total, column=column, value=value, menus=menus,
                               m=manifest, args=args, sort=sort, direction=direction,
                               searchable=bool(search.text_columns(t)))

    @app.route("/t/<name>/<int:number>")
    def row(name: str, number: int):
        t = table(name)
        r = row_or_404(t, number)
        docs = _docs(manifest, name)
        fields = [{"name": k, "doc": docs.get(k, ""), "text": _full(v), "image": _image_type(v) is not None}
                  for k, v in r.items()]
        return render_template("row.html", name=name, number=number, fields=fields, rows=t.rows, m=manifest,
                               missing=run.missing, **run.look.row(table, run.dataset_dir, name, r, number))


def _search_pages(app: Flask, run: _Run) -> None:
    """A table's text searched (search.py), and its columns' statistics (stats.py)."""
    manifest, table = run.manifest, run.table

    @app.route("/t/<name>/search")
    def search_rows(name: str):
        t = table(name)
        term, searched = request.args.get("q") or "", search.text_columns(t)
        if not searched:
            abort(400, f"{name} has no text columns to search (its columns: {', '.join(t.schema.names)})")
        if len(term) > search.MAX_TERM:
            abort(400, f"a search term is at most {search.MAX_TERM} characters; this one has {len(term)}")
        found = run.matches(t, term) if term else search.Found((), (), False)
        page, pages, lo, hi = page_span(request.args.get("page"), len(found.numbers))
        shown = list(found.numbers[lo:hi])
        cells = [[dict(_cell_parts(r.get(c)), hit=c in hits) for c in t.schema.names]
                 for r, hits in zip(t.rows_at(shown), found.columns[lo:hi])]
        return render_template("search.html", name=name, term=term, searched=searched, columns=t.schema.names,
                               rows=list(zip(shown, cells)), total=len(found.numbers), more=found.more,
                               limit=search.MAX_MATCHES, page=page, pages=pages, m=manifest,
                               args={"q": term} if term else {})

    @app.route("/t/<name>/stats")
    def statistics(name: str):
        t = table(name)
        columns = [{"s": s, "low": stats.number(s.low), "high": stats.number(s.high), "mean": stats.number(s.mean),
                    "bars": stats.bars(s), "top": [(_cell(v, 80), n, len(v) <= 80) for v, n in s.top]}
                   for s in run.statistics(t)]
        return render_template("stats.html", name=name, rows=t.rows, columns=columns, m=manifest,
                               filters=set(t.filter_columns))


def _picture_routes(app: Flask, run: _Run) -> None:
    """An image a row holds, pictures drawn from the rows (gallery.py), and the figures a trainer
    wrote beside the data."""
    table = run.table

    @app.route("/t/<name>/<int:number>/<field>")
    def image(name: str, number: int, field: str):
        t = table(name)
        r = row_or_404(t, number)
        kind = _image_type(r.get(field))
        if kind is None:
            abort(404, f"{name} row {number}: {field!r} holds no image")
        size = image_size.dimensions(r[field])
        if not isinstance(size, tuple) or size[0] * size[1] > MAX_IMAGE_PIXELS:
            abort(404, f"{name} row {number}: {field!r} is no image a browser should decode "
                       f"({'its header is unreadable' if not isinstance(size, tuple) else f'{size[0]} x {size[1]} pixels'})")
        return Response(r[field], mimetype=kind)

    @app.route("/pictures/<name>.png")
    @app.route("/pictures/<name>/<int:number>.png")
    @app.route("/pictures/<name>/<int:number>/<view>.png")
    def picture_png(name: str, number: int | None = None, view: str | None = None):
        """A picture of the data (gallery.py), drawn on the first request and then kept."""
        if run.missing:
            abort(404, f"pictures need {', '.join(run.missing)}: pip install 'shardsmith[train]'")
        try:
            return Response(run.picture(name, number, view), mimetype="image/png")
        except LookupError as exc:
            abort(404, str(exc))

    @app.route("/trained/<path:name>")
    def trained(name: str):
        """A figure `shardsmith train` wrote beside the data, of the names the look allows; nothing else."""
        folder = train_dir(run.dataset_dir)
        path = os.path.join(folder, name) if folder and name in run.look.trained_figures(run.dataset_dir) else None
        if path is None or not os.path.isfile(path):
            abort(404, f"no trained figure {name!r} beside this dataset "
                       f"(run `shardsmith train {run.manifest['dataset']}`)")
        if os.path.islink(folder) or not resolves_inside(folder, path):
            abort(403, f"the trained figure {name!r} resolves outside {folder} (a symbolic link): not served")
        with open(path, "rb") as fh:
            data = fh.read()
        if _image_type(data) != "image/png":
            abort(404, f"{name} is not a PNG")
        return Response(data, mimetype="image/png")


def _error_pages(app: Flask, run: _Run) -> None:
    """Every error as a page that says what to do: a bad request, a run that cannot be read, a file
    deleted under the viewer."""
    manifest, dataset_dir = run.manifest, run.dataset_dir

    @app.errorhandler(400)
    @app.errorhandler(403)
    @app.errorhandler(404)
    def error(exc):
        return render_template("error.html", message=exc.description, m=manifest), exc.code

    @app.context_processor
    def replaced():                         # the generation this app took over from (Following), if any
        return {"replaced": app.config["REPLACED"]}

    @app.errorhandler(Exception)
    def broken(exc):                        # a run that cannot be read as its manifest says: say why
        if isinstance(exc, HTTPException):
            return exc
        app.logger.exception("viewing %s", dataset_dir)
        message = (f"this run cannot be read here ({type(exc).__name__}: {exc}); "
                   f"`shardsmith validate {dataset_dir}` says what is wrong with it")
        header = {"dataset": manifest.get("dataset"), "generation": manifest.get("generation"),
                  "tables": {}, "dead_letters": {}}     # nothing of its tables: they may be what is broken
        return render_template("error.html", message=message, m=header), 500

    @app.errorhandler(FileNotFoundError)
    def gone(exc):                          # a part deleted under the page: the run was replaced or removed
        message = (f"a file of {manifest['generation']} is gone ({exc.filename or exc}): the run was replaced "
                   f"or deleted while you viewed it; reload the page")
        return render_template("error.html", message=message, m=manifest), 410


class Following:
    """The app of the dataset's current generation. A run replaced (`--overwrite`) while it is viewed
    is noticed at the next request (the manifest is read again at most every `every_s`): the viewer
    moves to the new generation and its pages say which one they replaced."""

    def __init__(self, dataset_dir: str, every_s: float = 1.0):
        self.dataset_dir, self.every_s = dataset_dir, every_s
        self.app = make_app(dataset_dir)
        self._lock = threading.Lock()
        self._checked = time.monotonic()

    def current(self) -> Flask:
        with self._lock:
            if time.monotonic() - self._checked >= self.every_s:
                self._checked = time.monotonic()
                shown = self.app.config["GENERATION"]
                try:
                    generation = read_manifest(self.dataset_dir).get("generation")
                except OSError:                 # gone or unreachable: keep what is shown
                    generation = shown
                if generation != shown:
                    app = make_app(self.dataset_dir)
                    app.config.update(VIEW_HOSTS=self.app.config["VIEW_HOSTS"], REPLACED=shown)
                    self.app = app
            return self.app

    def __call__(self, environ, start_response):
        return self.current()(environ, start_response)


def listen(dataset_dir: str, host: str, port: int, allow_hosts=(), every_s: float = 1.0):
    """The viewer's threaded server bound to host:port (OSError if it cannot), answering only the
    Host values hosts.allowed gives for the port it got, following the dataset to a new generation."""
    from werkzeug.serving import make_server
    following = Following(dataset_dir, every_s)
    server = make_server(host, port, following, threaded=True)
    following.app.config["VIEW_HOSTS"] = hosts.allowed(host, server.server_port, allow_hosts)
    return server


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


# bidi overrides, embeddings, isolates and marks, and the C0/C1 controls but tab and newline: shown
# as a mark, never applied (a U+202E in a page title would reverse the text after it)
_INVISIBLE = dict.fromkeys([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), *range(0x7F, 0xA0), 0x061C, 0x200E,
                            0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)])
_INVISIBLE = {c: f"⟨U+{c:04X}⟩" for c in _INVISIBLE}


def visible(value):
    """A value as the page shows it (Jinja's finalize, before escaping): strings with their control
    and bidi characters written as marks."""
    if isinstance(value, Markup):            # already escaped (a macro's output): marks are plain text
        return Markup(str.translate(value, _INVISIBLE))
    return value.translate(_INVISIBLE) if isinstance(value, str) else value


def _listing_args(t: Table, name: str) -> tuple[str, str | None, str, str, dict]:
    """A table page's ?column=&value= (a filter) and ?sort=&order= (an order), checked: a column that
    is no filter column, or an order that cannot be, is the user's mistake (a 400). Also the
    arguments the page's links carry on."""
    column, value = request.args.get("column") or "", request.args.get("value")
    if column and column not in t.filter_columns:
        abort(400, f"{column!r} is not a filter column of {name} (filter by one of {t.filter_columns})")
    sort, direction = request.args.get("sort") or "", request.args.get("order") or "asc"
    why = order.refusal(t, sort, direction) if sort else None
    if why:
        abort(400, why)
    args = {"column": column, "value": value} if column else {}
    if sort:
        args.update(sort=sort, order=direction)
    return column, value, sort, direction, args


def _headers(t: Table, args: dict) -> list[dict]:
    """Each column's header: a link that sorts by it (ascending; descending when it is sorted
    ascending already), keeping the filter; none for a column whose values have no order."""
    kept = {k: v for k, v in args.items() if k in ("column", "value")}
    out = []
    for f in t.schema:
        now = args.get("order") if args.get("sort") == f.name else None
        href = (url_for("rows", name=t.name, sort=f.name, order="desc" if now == "asc" else "asc", **kept)
                if order.sortable(f.type) else None)
        out.append({"name": f.name, "href": href, "sorted": now})
    return out


def _cell_parts(value, column: str = "") -> dict:
    """A cell as a table page shows it: its first CELL_CHARS characters (cut at a space where one is
    near), the rest up to CELL_MORE to open under them, and whether even that is not all of it; an
    image as its thumbnail (`thumb`: the column it is in)."""
    text = _full(value)
    if column and _image_type(value):
        return {"head": text, "rest": "", "cut": False, "thumb": column}
    if len(text) <= CELL_CHARS:
        return {"head": text, "rest": "", "cut": False}
    end = text.rfind(" ", CELL_CHARS // 2, CELL_CHARS)
    end = end + 1 if end > 0 else CELL_CHARS
    return {"head": text[:end], "rest": text[end:CELL_MORE], "cut": len(text) > CELL_MORE}


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
