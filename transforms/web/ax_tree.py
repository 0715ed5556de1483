"""The enhanced accessibility tree: `Accessibility.getFullAXTree` joined with `DOMSnapshot` boxes.

Plain functions over the two CDP replies (already parsed JSON), so they can be tested and
timed without a browser. The join goes through `backendDOMNodeId`, the one id both domains
share. Only visible nodes are kept: not AX-ignored, with a layout box of non-zero area inside
the captured area, and not `visibility: hidden|collapse`. A dropped node's children are
re-attached to its nearest kept ancestor, and depths are recomputed from the kept tree.
"""
from __future__ import annotations

from transforms.web import urls


# roles that are interactive even when the node is not focusable (schema: "interactive")
INTERACTIVE_ROLES = frozenset({
    "link", "button", "textbox", "checkbox", "radio", "combobox", "menuitem", "tab", "switch",
    "slider", "searchbox", "option",
})
_HIDDEN_VISIBILITY = ("hidden", "collapse")
_TEXT_ROLES = ("StaticText",)


class SnapshotIndex:
    """Lookups into the main document of a `DOMSnapshot.captureSnapshot` reply
    (computedStyles=["visibility"]), built once per page with plain dicts."""

    def __init__(self, snapshot: dict):
        self.strings: list[str] = snapshot["strings"]
        doc = snapshot["documents"][0]
        nodes, layout = doc["nodes"], doc["layout"]
        self.node_name: list[int] = nodes["nodeName"]
        self.attributes: list[list[int]] = nodes.get("attributes") or []
        self.by_backend = {b: i for i, b in enumerate(nodes["backendNodeId"])}
        self.bounds: list[list[float]] = layout["bounds"]
        self.styles: list[list[int]] = layout["styles"]
        # first layout object of a DOM node (a node split over lines has several; the first
        # LayoutObject's bounds already cover its fragments)
        self.layout_of: dict[int, int] = {}
        for li, ni in enumerate(layout["nodeIndex"]):
            self.layout_of.setdefault(ni, li)
        self.document_url = self.strings[doc["documentURL"]] if isinstance(doc.get("documentURL"), int) else ""
        self.base_url = self.strings[doc["baseURL"]] if isinstance(doc.get("baseURL"), int) else self.document_url
        self.dom_nodes = len(self.node_name)

    def tag(self, i: int) -> str:
        return self.strings[self.node_name[i]].lower()

    def attrs(self, i: int) -> dict[str, str]:
        if i >= len(self.attributes):
            return {}
        a, s = self.attributes[i], self.strings
        return {s[a[k]].lower(): s[a[k + 1]] for k in range(0, len(a) - 1, 2)}

    def visible_bounds(self, i: int):
        """(x, y, w, h) in CSS px of the document, or None when there is no box or it is hidden."""
        li = self.layout_of.get(i)
        if li is None:
            return None
        st = self.styles[li]
        if st and self.strings[st[0]] in _HIDDEN_VISIBILITY:
            return None
        return self.bounds[li]


def build_nodes(ax_nodes: list[dict], snap: SnapshotIndex, *, scale: float, width: int, height: int,
                page_url: str = "") -> tuple[list[dict], int]:
    """Visible nodes in document order as NODE dicts (schemas/multiui.py) and their text_chars.

    scale: screenshot pixels per CSS pixel (the device scale factor); width, height: the
    screenshot size in pixels (boxes are clipped to it and normalised by it)."""
    by_id = {n["nodeId"]: n for n in ax_nodes}
    roots = [n for n in ax_nodes if "parentId" not in n or n["parentId"] not in by_id]
    base = snap.base_url or page_url
    out: list[dict] = []
    text_chars = 0
    inv_w, inv_h = 1.0 / width, 1.0 / height
    # iterative DFS in child order = document order; stack holds (ax node, kept ancestor id, its depth)
    stack = [(r, -1, -1) for r in reversed(roots)]
    while stack:
        n, parent, pdepth = stack.pop()
        kept = None
        if not n.get("ignored"):
            kept = _node(n, snap, scale, width, height, base, parent, pdepth + 1, inv_w, inv_h,
                         is_root=parent == -1 and not out)
        if kept is not None:
            kept["node_id"] = len(out)
            out.append(kept)
            if kept["role"] in _TEXT_ROLES:
                text_chars += len(kept["name"])
            parent, pdepth = kept["node_id"], kept["depth"]
        for cid in reversed(n.get("childIds") or ()):
            c = by_id.get(cid)
            if c is not None:
                stack.append((c, parent, pdepth))
    return out, text_chars


def _node(n, snap, scale, width, height, base, parent, depth, inv_w, inv_h, is_root):
    bid = n.get("backendDOMNodeId")
    i = snap.by_backend.get(bid) if bid is not None else None
    if i is None:
        return None
    if is_root:
        b = (0.0, 0.0, width / scale, height / scale)  # the document itself: the whole capture
    else:
        b = snap.visible_bounds(i)
        if b is None:
            return None
    x, y, w, h = b
    left, top = max(0.0, x * scale), max(0.0, y * scale)
    right, bottom = min(float(width), (x + w) * scale), min(float(height), (y + h) * scale)
    if right <= left or bottom <= top:
        return None
    role = (n.get("role") or {}).get("value") or ""
    focusable = False
    for p in n.get("properties") or ():
        if p.get("name") == "focusable":
            focusable = bool((p.get("value") or {}).get("value"))
            break
    tag = snap.tag(i)
    href = src = alt = None
    if tag in ("a", "area", "img", "input", "link", "image"):
        at = snap.attrs(i)
        if "href" in at:
            href = _resolve(base, at["href"])
        if "src" in at:
            src = _resolve(base, at["src"])
        alt = at.get("alt")
    return {
        "node_id": -1, "parent": parent, "depth": depth, "role": role,
        "name": str((n.get("name") or {}).get("value") or ""), "tag": tag,
        "box": [left, top, right, bottom],
        "box_norm": [left * inv_w, top * inv_h, right * inv_w, bottom * inv_h],
        "interactive": focusable or role in INTERACTIVE_ROLES,
        "href": href, "src": src, "alt": alt,
    }


def _resolve(base: str, ref: str) -> str:
    """The URL the browser would follow (WHATWG), or the attribute as written when it has none."""
    try:
        return urls.join(base, ref)
    except urls.BadUrl:
        return ref.strip()
