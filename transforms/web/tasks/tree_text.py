"""The accessibility tree as compact indented text, the view of a page an LLM prompt gets.

One line per node that carries meaning:

    *link "Sign in" [1180,12,1250,40]

indent = depth among the kept nodes, `*` marks an interactive node, the box is
[left, top, right, bottom] in screenshot pixels. Unnamed structural nodes (generic,
none, presentation, inline text boxes) and unnamed text, paragraphs and images are left
out, their children moving up a level; a text node that repeats its parent's name is left out too. Long names are cut
to `name_chars`. The whole text stays within `max_chars`: lines past the budget are
replaced by one `... (N more nodes)` line, and with `focus` the budget is spent on a
window of lines around the focused node instead of the page's top. Same nodes, same text.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

from transforms.web.tasks.elements import clean_text, name_key, role_of

SKIP_UNNAMED = frozenset({"generic", "none", "presentation", "inlinetextbox", "linebreak", "div", "span",
                          "group", "section", "ignored", "statictext", "text", "paragraph", "image", "img", ""})
ALWAYS_SKIP = frozenset({"inlinetextbox", "linebreak"})
MAX_INDENT = 16


def _box_text(node: Mapping) -> str:
    box = node.get("box")
    if box is None or len(box) != 4:
        return ""
    return " [" + ",".join(str(int(round(float(v)))) for v in box) + "]"


def _line(node: Mapping, depth: int, name_chars: int) -> str:
    name = clean_text(node.get("name"))
    if len(name) > name_chars:
        name = name[: max(1, name_chars - 1)].rstrip() + "…"
    role = str(node.get("role") or "node")
    star = "*" if node.get("interactive") else ""
    named = f' "{name}"' if name else ""
    return f"{' ' * min(depth, MAX_INDENT)}{star}{role}{named}{_box_text(node)}"


def tree_lines(nodes: Sequence[Mapping], name_chars: int = 100) -> list[tuple[int, str]]:
    """(node_id, line) for every kept node, in the order of `nodes` (document order)."""
    by_id = {int(n["node_id"]): n for n in nodes}
    kept: dict[int, int] = {}  # node_id -> depth among kept nodes
    lines = []
    for node in nodes:
        node_id, parent = int(node["node_id"]), int(node.get("parent", -1))
        # depth = depth of the nearest kept ancestor + 1
        ancestor, depth, seen = parent, 0, set()
        while ancestor in by_id and ancestor not in seen:
            seen.add(ancestor)
            if ancestor in kept:
                depth = kept[ancestor] + 1
                break
            ancestor = int(by_id[ancestor].get("parent", -1))
        role, key = role_of(node), name_key(node.get("name"))
        if role in ALWAYS_SKIP or (not key and role in SKIP_UNNAMED and not node.get("interactive")):
            continue
        if key and role in ("statictext", "text") and parent in by_id and name_key(by_id[parent].get("name")) == key:
            continue
        kept[node_id] = depth
        lines.append((node_id, _line(node, depth, name_chars)))
    return lines


def tree_text(nodes: Sequence[Mapping], max_chars: int = 6000, focus: Optional[int] = None,
              name_chars: int = 100) -> str:
    """The tree as text within `max_chars` characters; see the module docstring for the format."""
    if max_chars < 40:
        raise ValueError(f"tree_text max_chars must be at least 40, got {max_chars}")
    lines = tree_lines(nodes, name_chars)
    if not lines:
        return ""
    texts = [text for _, text in lines]
    start = 0
    if focus is not None:
        ids = [node_id for node_id, _ in lines]
        start = ids.index(focus) if focus in ids else 0
    lo, hi = _window(texts, start, max_chars - 30 if len(texts) > 1 else max_chars, centred=focus is not None)
    out = texts[lo:hi]
    if lo > 0:
        out.insert(0, f"... ({lo} nodes before)")
    if hi < len(texts):
        out.append(f"... ({len(texts) - hi} more nodes)")
    text = "\n".join(out)
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def _window(texts: list[str], start: int, budget: int, centred: bool) -> tuple[int, int]:
    """[lo, hi) lines around `start` whose joined length fits the budget (at least the start line)."""
    lo, hi = start, start + 1
    used = len(texts[start])
    grow_up = centred
    while True:
        grew = False
        for up in ((grow_up, not grow_up) if centred else (False,)):
            if up and lo > 0 and used + len(texts[lo - 1]) + 1 <= budget:
                lo -= 1
                used += len(texts[lo]) + 1
                grew = True
            elif not up and hi < len(texts) and used + len(texts[hi]) + 1 <= budget:
                used += len(texts[hi]) + 1
                hi += 1
                grew = True
        if not grew:
            return lo, hi
