"""multiui in the viewer: a sample over its page's screenshot with its box, a page beside its
renders on the other platforms with curation's verdict, and the pages at a glance: a thumbnail of
each screenshot (thumbnails.py) with its platform, verdict and title, a row link each."""
from __future__ import annotations

from flask import Flask, render_template, request

from pipelines.viewer import pictures, thumbnails
from pipelines.viewer.look import Look, TableOf, page_span

# the narrow columns the glance reads (never the HTML, tree or screenshot beside them)
GLANCE = ("url", "title", "platform", "viewport_width", "viewport_height", "screenshot_width", "kept", "reject_reason")


def page_renders(table: TableOf, number: int) -> list[tuple[int, dict]]:
    """The page at `number` and its renders on the other platforms (same URL), desktop first."""
    pages = table("pages")
    page = pages.row(number)
    found = [n for n in pages.matching("url", page["url"]) if n != number]
    renders = [(number, page)] + list(zip(found, pages.rows_at(found)))
    return sorted(renders, key=lambda nr: (nr[1]["platform"] != "desktop", nr[1]["platform"], nr[0]))


def verdict(page: dict) -> str:
    return "kept" if page["kept"] else f"dropped: {page['reject_reason']}"


def sample_picture(table, sample: dict) -> dict | None:
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


def renders(table, number: int) -> list[dict]:
    """A multiui page and its renders on the other platform: row, platform, viewport, verdict."""
    return [{"number": n, "platform": p["platform"], "viewport": f"{p['viewport_width']}x{p['viewport_height']}",
             "kept": p["kept"], "verdict": verdict(p), "screenshot": p["screenshot"] is not None}
            for n, p in page_renders(table, number)]


def glance(table: TableOf, page_arg: str | None) -> tuple[list[dict], int, int, int]:
    """One page of the pages table as the glance lists it: (rows, total, page, pages), `page_arg`
    (?page=) checked as every listing's is; a row says whether it has a screenshot to show small."""
    cols = table("pages").columns(GLANCE)
    total = cols.num_rows
    page, pages, lo, hi = page_span(page_arg, total)
    rows = [{"number": lo + k, "platform": p["platform"], "viewport": f"{p['viewport_width']}x{p['viewport_height']}",
             "kept": p["kept"], "verdict": verdict(p), "title": p["title"], "url": p["url"],
             "screenshot": bool(p["screenshot_width"])}
            for k, p in enumerate(cols.slice(lo, hi - lo).to_pylist())]
    return rows, total, page, pages


class MultiUILook(Look):
    pictures = ("pair",)
    row_pictures = {"pair": "pages"}

    def overview(self, table, dataset_dir, manifest):
        return {"pages": manifest["tables"]["pages"]["rows"]} if "pages" in manifest["tables"] else None

    def routes(self, app: Flask, table: TableOf, dataset_dir: str, manifest: dict) -> None:
        @app.route("/multiui/pages", endpoint="glance")
        def glance_page():
            """The pages, 25 at a time: each screenshot as a thumbnail that opens its row."""
            rows, total, page, pages = glance(table, request.args.get("page"))
            return render_template("multiui-pages.html", m=manifest, rows=rows, total=total, page=page, pages=pages,
                                   unavailable=thumbnails.unavailable())

    def row(self, table, dataset_dir, name, row, number):
        if name == "samples":
            return {"picture": sample_picture(table, row)}
        if name == "pages":
            return {"renders": renders(table, number)}
        return {}

    def picture(self, table, dataset_dir, name, number, view):
        return pictures.page_pair([page for _, page in page_renders(table, number)])


LOOK = MultiUILook()
