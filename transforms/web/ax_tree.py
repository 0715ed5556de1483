"""The enhanced accessibility tree: `Accessibility.getFullAXTree` joined with `DOMSnapshot` boxes.

Plain functions over the two CDP replies (already parsed JSON), so they can be tested and
timed without a browser. The join goes through `backendDOMNodeId`, the one id both domains
share. Only visible nodes are kept: not AX-ignored, with a layout box of non-zero area inside
the captured area, and not `visibility: hidden|collapse`; with SnapshotIndex.PARAMS also not
clipped away by an ancestor's overflow, transparent, or (text) covered by an opaque overlay,
and boxes are clipped to what the overflow lets show. A dropped node's children are
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
TEXT_ROLES = ("StaticText",)   # nodes whose name is painted text (text_chars, glyphs_missing)
_NO_CLIP_TAGS = ("html", "body")        # their overflow applies to the viewport (CSS Overflow 3)
_OVERLAY_POSITIONS = ("fixed", "sticky", "absolute")
MIN_TEXT_PX = 2.0                       # clipped text thinner than this shows nothing (sr-only: 1 px)
MIN_ALPHA = 0.05                        # opacity products below this are invisible


class SnapshotIndex:
    """Lookups into the main document of a `DOMSnapshot.captureSnapshot` reply, built once per
    page with plain dicts.

    Asked with PARAMS it also tells what the screenshot cannot show: text and elements clipped
    away by an ancestor's overflow (a carousel's other slides, screen-reader-only text), at
    opacity 0 (with their ancestors', products) or with a transparent text colour, and text that
    a later-painted opaque fixed/sticky/absolute box (a cookie banner) covers at its centre: a
    geometric hit test over the snapshot's paint order, so it needs no extra round trip.
    """

    PARAMS = {"computedStyles": ["visibility", "opacity", "overflow-x", "overflow-y", "position",
                                 "background-color"],
              "includePaintOrder": True, "includeTextColorOpacities": True}

    def __init__(self, snapshot: dict):
        self.strings: list[str] = snapshot["strings"]
        doc = snapshot["documents"][0]
        nodes, layout = doc["nodes"], doc["layout"]
        self.node_name: list[int] = nodes["nodeName"]
        self.node_type: list[int] = nodes.get("nodeType") or []
        self.parent: list[int] = nodes.get("parentIndex") or []
        self.attributes: list[list[int]] = nodes.get("attributes") or []
        self.by_backend = {b: i for i, b in enumerate(nodes["backendNodeId"])}
        self.bounds: list[list[float]] = layout["bounds"]
        self.styles: list[list[int]] = layout["styles"]
        self.paint: list[int] = layout.get("paintOrders") or []
        self.text_alpha: list[float] = layout.get("textColorOpacities") or []
        self._effect: dict[int, tuple] = {}       # DOM index -> (alpha, clip) passed on to descendants
        self._overlays: list | None = None
        # first layout object of a DOM node (a node split over lines has several; the first
        # LayoutObject's bounds already cover its fragments)
        self.layout_of: dict[int, int] = {}
        self.layout_index: list[int] = layout["nodeIndex"]
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

    def style(self, li: int, k: int) -> str:
        st = self.styles[li]
        return self.strings[st[k]] if k < len(st) and st[k] >= 0 else ""

    def _own(self, i: int) -> tuple[float, tuple | None, bool]:
        """(opacity, clip rect it puts on its descendants or None, is position: fixed)."""
        li = self.layout_of.get(i)
        if li is None:
            return 1.0, None, False
        try:
            alpha = float(self.style(li, 1) or 1)
        except ValueError:
            alpha = 1.0
        clip = None
        ox, oy = self.style(li, 2), self.style(li, 3)
        if (ox or oy) and (ox, oy) != ("visible", "visible") and self.tag(i) not in _NO_CLIP_TAGS:
            x, y, w, h = self.bounds[li]
            inf = float("inf")
            clip = (x if ox != "visible" else -inf, y if oy != "visible" else -inf,
                    x + w if ox != "visible" else inf, y + h if oy != "visible" else inf)
        return alpha, clip, self.style(li, 4) == "fixed"

    def _parent(self, i: int) -> int:
        p = self.parent[i] if i < len(self.parent) else -1
        return p if 0 <= p < i else -1          # snapshot nodes come parents first

    def _passed_on(self, k: int) -> tuple[float, tuple | None]:
        """(opacity product, clip rect) that node k puts on its descendants; memoised up the tree."""
        chain, j = [], k
        while j >= 0 and j not in self._effect:
            chain.append(j)
            j = self._parent(j)
        for node in reversed(chain):            # top ancestor first
            p = self._parent(node)
            alpha, clip = self._effect[p] if p >= 0 else (1.0, None)
            own_alpha, own_clip, fixed = self._own(node)
            clip = None if fixed else clip      # a fixed box escapes its ancestors' overflow
            if own_clip is not None:
                clip = own_clip if clip is None else (max(clip[0], own_clip[0]), max(clip[1], own_clip[1]),
                                                      min(clip[2], own_clip[2]), min(clip[3], own_clip[3]))
            self._effect[node] = (alpha * own_alpha, clip)
        return self._effect[k]

    def effect(self, i: int) -> tuple[float, tuple | None]:
        """(opacity product, clip rect) that node i's ancestors put on it."""
        p = self._parent(i)
        alpha, clip = self._passed_on(p) if p >= 0 else (1.0, None)
        return alpha, None if self._own(i)[2] else clip

    def overlays(self) -> list:
        """(x0, y0, x1, y1, paint order, DOM index) of the opaque fixed/sticky/absolute boxes."""
        if self._overlays is None:
            self._overlays = []
            if self.paint and any(len(st) >= 6 for st in self.styles):
                for li, i in enumerate(self.layout_index):
                    if self.style(li, 4) in _OVERLAY_POSITIONS and _opaque(self.style(li, 5)):
                        x, y, w, h = self.bounds[li]
                        if w > 0 and h > 0 and self.effect(i)[0] * _float(self.style(li, 1)) >= 0.95:
                            self._overlays.append((x, y, x + w, y + h, self.paint[li], i))
        return self._overlays

    def covered(self, i: int, li: int, box: tuple) -> bool:
        """Whether an opaque overlay painted after text node i hides the centre of its box."""
        if not self.paint:
            return False
        cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
        mine = self.paint[li]
        hits = [o for o in self.overlays() if o[4] > mine and o[0] <= cx <= o[2] and o[1] <= cy <= o[3]]
        if not hits:
            return False
        ancestors, j = set(), i
        while 0 <= j < len(self.parent) and j not in ancestors:
            ancestors.add(j)
            j = self.parent[j]
        return any(o[5] not in ancestors for o in hits)

    def visible_bounds(self, i: int):
        """(x, y, w, h) in CSS px of the document, clipped by the ancestors' overflow; None when
        there is no box, or the screenshot cannot show it (hidden, clipped away, transparent,
        or, for text, covered or thinner than MIN_TEXT_PX once clipped)."""
        li = self.layout_of.get(i)
        if li is None:
            return None
        st = self.styles[li]
        if st and self.strings[st[0]] in _HIDDEN_VISIBILITY:
            return None
        x, y, w, h = self.bounds[li]
        if len(st) < 2:                         # a snapshot without PARAMS (or the document): the box only
            return self.bounds[li]
        alpha, clip = self.effect(i)
        text = i < len(self.node_type) and self.node_type[i] == 3
        if alpha * (1.0 if text else _float(self.style(li, 1))) < MIN_ALPHA:
            return None
        if text and li < len(self.text_alpha) and self.text_alpha[li] < MIN_ALPHA:
            return None
        x0, y0, x1, y1 = x, y, x + w, y + h
        if clip is not None:
            x0, y0, x1, y1 = max(x0, clip[0]), max(y0, clip[1]), min(x1, clip[2]), min(y1, clip[3])
            if x1 <= x0 or y1 <= y0:
                return None
        if text and (x1 - x0 < MIN_TEXT_PX or y1 - y0 < MIN_TEXT_PX or self.covered(i, li, (x0, y0, x1, y1))):
            return None
        return (x0, y0, x1 - x0, y1 - y0)


def _float(text: str) -> float:
    try:
        return float(text) if text else 1.0
    except ValueError:
        return 1.0


def _opaque(color: str) -> bool:
    """A computed background-color that hides what is under it: rgb(...), or rgba(...) with alpha >= 0.95."""
    if color.startswith("rgb("):
        return True
    if color.startswith("rgba("):
        return _float(color[5:-1].split(",")[-1].strip()) >= 0.95
    return False


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
            if kept["role"] in TEXT_ROLES:
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
