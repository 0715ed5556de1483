"""multiui in the viewer: a sample over its page's screenshot with its box, and a page beside its
renders on the other platforms with curation's verdict."""
from __future__ import annotations

from pipelines.viewer import pictures
from pipelines.viewer.look import Look, TableOf


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


class MultiUILook(Look):
    pictures = ("pair",)
    row_pictures = {"pair": "pages"}

    def row(self, table, dataset_dir, name, row, number):
        if name == "samples":
            return {"picture": sample_picture(table, row)}
        if name == "pages":
            return {"renders": renders(table, number)}
        return {}

    def picture(self, table, dataset_dir, name, number, view):
        return pictures.page_pair([page for _, page in page_renders(table, number)])


LOOK = MultiUILook()
