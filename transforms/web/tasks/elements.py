"""What every MultiUI task generator shares: quality rules, element choice and the sample row.

A task generator reads one `pages` row (a plain dict) and returns a `TaskOutput`: the
`samples` rows it made, the LLM requests it planned, and how many candidates it skipped and
why. Skips are quality decisions (a duplicated name is ambiguous for grounding, a 2 px box
is not a target), not bad input, so they are counted, not dead-lettered; `rejected` holds
the bad input (a page without a screenshot, a model answer that cannot be parsed), which
the stage turns into dead-letter rows.
"""
from __future__ import annotations

import math
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from schemas import multiui as schema
from transforms.io.ids import stable_id
from core.rejected import Rejected

IMAGE_TOKEN = "<image>\n"
RULE = "rule"

# Roles whose accessible name is text visible on the screen (OCR targets).
TEXT_ROLES = frozenset({
    "statictext", "text", "paragraph", "heading", "link", "button", "listitem", "cell", "gridcell",
    "columnheader", "rowheader", "label", "labeltext", "caption", "menuitem", "tab", "option",
    "code", "blockquote", "term", "definition", "strong", "emphasis", "legend", "figcaption",
})
# Roles a user can point at by name (grounding targets): visible text plus named images and controls.
GROUNDING_ROLES = TEXT_ROLES | frozenset({
    "image", "img", "textbox", "searchbox", "checkbox", "radio", "combobox", "switch", "slider",
    "menuitemcheckbox", "menuitemradio", "spinbutton",
})
IMAGE_ROLES = frozenset({"image", "img"})
# Roles of text nodes: their name is the painted text itself (Chromium's StaticText).
TEXT_LEAVES = frozenset({"statictext", "text"})

ROLE_WORDS = {
    "statictext": "text", "text": "text", "paragraph": "paragraph", "heading": "heading", "link": "link",
    "button": "button", "listitem": "list item", "cell": "table cell", "gridcell": "table cell",
    "columnheader": "column header", "rowheader": "row header", "label": "label", "labeltext": "label",
    "image": "image", "img": "image", "textbox": "text box", "searchbox": "search box",
    "checkbox": "checkbox", "radio": "radio button", "combobox": "drop-down", "menuitem": "menu item",
    "tab": "tab", "option": "option", "switch": "switch", "slider": "slider",
}


@dataclass(frozen=True)
class TaskRules:
    """Quality rules and caps shared by the task generators (the `tasks` part of the multiui config).

    max_per_task: samples (or LLM requests) per page per task; min_box_px: smallest target side;
    max_grounding_chars: longer names make poor grounding queries; max_ocr_chars: longest OCR answer;
    min_ocr_chars: shortest text worth reading back; min_image_px: smallest embedded image side.
    """

    max_per_task: int = 8
    min_box_px: float = 4.0
    max_grounding_chars: int = 80
    min_ocr_chars: int = 6
    max_ocr_chars: int = 300
    min_image_px: float = 32.0

    def __post_init__(self):
        if not isinstance(self.max_per_task, int) or self.max_per_task < 0:
            raise ValueError(f"tasks.max_per_task must be an integer >= 0, got {self.max_per_task!r}")
        if self.min_box_px < 0 or self.min_image_px < 0:
            raise ValueError("tasks.min_box_px and tasks.min_image_px must be >= 0")
        if self.min_ocr_chars > self.max_ocr_chars:
            raise ValueError("tasks.min_ocr_chars must not exceed tasks.max_ocr_chars")


@dataclass
class TaskOutput:
    """What one generator made from one page: samples, planned requests, skips by reason, bad input."""

    task: str
    samples: list = field(default_factory=list)
    requests: list = field(default_factory=list)  # (Request, meta dict) pairs
    skipped: Counter = field(default_factory=Counter)
    rejected: list = field(default_factory=list)

    def skip(self, reason: str, count: int = 1) -> None:
        if count:
            self.skipped[reason] += count


def rng_for(*parts: Any) -> random.Random:
    """A random.Random seeded from a stable id: the same parts give the same draws everywhere."""
    return random.Random(int(stable_id(*parts), 16))


def clean_text(text: Optional[str]) -> str:
    """Whitespace collapsed to single spaces; None becomes ''."""
    return " ".join((text or "").split())


def name_key(text: Optional[str]) -> str:
    return clean_text(text).casefold()


def role_of(node: Mapping) -> str:
    return str(node.get("role") or "").replace("_", "").replace(" ", "").casefold()


def role_word(node: Mapping) -> str:
    if role_of(node) == "heading" or heading_level(node):
        return "heading"
    return ROLE_WORDS.get(role_of(node), role_of(node) or "element")


def heading_level(node: Mapping) -> int:
    """1-6 for <h1>-<h6>, 0 for anything else (a role=heading on another tag included)."""
    tag = str(node.get("tag") or "").lower()
    return int(tag[1]) if re.fullmatch(r"h[1-6]", tag) else 0



def is_heading(node: Mapping) -> bool:
    return role_of(node) == "heading" or heading_level(node) > 0


def describe(node: Mapping) -> str:
    """How a question names an element: `the button "Sign in"`, or `the link` when it has no name."""
    name = clean_text(node.get("name"))
    return f'the {role_word(node)} "{name}"' if name else f"the {role_word(node)}"


def _box(node: Mapping, key: str) -> Optional[list]:
    box = node.get(key)
    if box is None or len(box) != 4:
        return None
    values = [float(v) for v in box]
    return values if all(math.isfinite(v) for v in values) else None


def box_problem(node: Mapping, page: Mapping, min_px: float) -> Optional[str]:
    """Why a node's box cannot be a target (too small, outside the screenshot), or None."""
    box, norm = _box(node, "box"), _box(node, "box_norm")
    if box is None or norm is None:
        return "box missing"
    left, top, right, bottom = box
    if right - left < min_px or bottom - top < min_px:
        return f"box under {min_px:g} px"
    width, height = page.get("screenshot_width") or 0, page.get("screenshot_height") or 0
    slack = 1.0  # renderers round boxes to the pixel
    if left < -slack or top < -slack or right > width + slack or bottom > height + slack:
        return "box outside the screenshot"
    if any(v < -0.001 or v > 1.001 for v in norm):
        return "box outside the screenshot"
    return None


def norm_bbox(node: Mapping) -> list:
    """The node's box_norm as the samples table stores it: floats, 3 decimals, clipped to [0, 1]."""
    return [min(1.0, max(0.0, round(v, 3))) for v in _box(node, "box_norm")]


def format_box(bbox: Sequence[float]) -> str:
    """The grounding answer format: `[0.123, 0.456, 0.789, 0.900]`."""
    return "[" + ", ".join(f"{v:.3f}" for v in bbox) + "]"


def reading_order(nodes: Iterable[Mapping]) -> list:
    """Top to bottom, then left to right, then node id (deterministic for equal boxes)."""
    return sorted(nodes, key=lambda n: (round(float(n["box"][1])), round(float(n["box"][0])), int(n["node_id"])))


class PageIndex:
    """Per-page lookups: nodes by id, names repeated by an ancestor, and name counts on the page.

    A link "Home" usually holds a text node "Home": the child repeats its ancestor's name, so it
    is a *shadow* and neither a separate target nor a duplicate. Two different elements named
    "Read more" are duplicates: a question naming one of them is ambiguous. Only visible
    elements (GROUNDING_ROLES) count: the document node, named after the page title, makes
    neither the h1 that repeats the title a shadow nor a duplicate.
    """

    def __init__(self, page: Mapping):
        self.page = page
        self.nodes = list(page.get("nodes") or [])
        self.by_id = {int(n["node_id"]): n for n in self.nodes}
        self._children: Optional[dict] = None
        self._text: dict[int, str] = {}
        self._shadow = {int(n["node_id"]): self._repeats_ancestor(n) for n in self.nodes}
        self.name_counts = Counter(name_key(n.get("name")) for n in self.nodes
                                   if name_key(n.get("name")) and role_of(n) in GROUNDING_ROLES
                                   and not self._shadow[int(n["node_id"])])

    def _repeats_ancestor(self, node: Mapping) -> bool:
        return self._ancestor_repeats(node, GROUNDING_ROLES, lambda n: name_key(n.get("name")))

    def _ancestor_repeats(self, node: Mapping, roles, key_of) -> bool:
        """Whether an ancestor with a role in `roles` has the same non-empty `key_of` as `node`."""
        key = key_of(node)
        if not key:
            return False
        seen, parent = set(), int(node.get("parent", -1))
        while parent in self.by_id and parent not in seen:
            seen.add(parent)
            ancestor = self.by_id[parent]
            if role_of(ancestor) in roles and key_of(ancestor) == key:
                return True
            parent = int(ancestor.get("parent", -1))
        return False

    def is_shadow(self, node: Mapping) -> bool:
        return self._shadow.get(int(node["node_id"]), False)

    def _children_map(self) -> dict:
        if self._children is None:
            self._children = {}
            for n in self.nodes:
                self._children.setdefault(int(n.get("parent", -1)), []).append(n)
        return self._children

    def visible_text(self, node: Mapping) -> str:
        """The text an OCR question can ask for: what the node's text descendants paint.

        Not the accessible name, which may come from aria-label, alt, title or screen-reader-only
        text: the tree keeps only text the screenshot shows (ax_tree.py drops clipped, covered
        and transparent text), and this joins what is left under the node, in document order.
        When that is the name with its spacing changed, the name is used (Chromium spaces the
        parts of a name as they are laid out). A node with no text under it reads as its name
        only when it is an <input>, whose value Chromium paints without a text node; otherwise ''.
        """
        node_id = int(node["node_id"])
        if node_id in self._text:
            return self._text[node_id]
        name = clean_text(node.get("name"))
        if role_of(node) in TEXT_LEAVES:
            text = name
        else:
            pieces = self._text_pieces(node_id)
            if not pieces:
                text = name if str(node.get("tag") or "").lower() == "input" else ""
            else:
                joined = _join_pieces(pieces)
                text = name if _squash(name) == _squash(joined) else joined
        self._text[node_id] = text
        return text

    def _text_pieces(self, node_id: int) -> list:
        """(text, box) of the text leaves under node_id, in document order."""
        children, out, stack, seen = self._children_map(), [], list(reversed(self._children_map().get(node_id, []))), set()
        while stack:
            n = stack.pop()
            nid = int(n["node_id"])
            if nid in seen:
                continue
            seen.add(nid)
            if role_of(n) in TEXT_LEAVES:
                text = str(n.get("name") or "")
                if text.strip():
                    out.append((text, n.get("box")))
                continue
            stack.extend(reversed(children.get(nid, [])))
        return out

    def repeats_ancestor_text(self, node: Mapping) -> bool:
        """Whether an OCR-able ancestor (TEXT_ROLES) shows the same text: the same words framed twice."""
        return self._ancestor_repeats(node, TEXT_ROLES, lambda n: self.visible_text(n).casefold())

    def is_duplicate(self, node: Mapping) -> bool:
        return self.name_counts[name_key(node.get("name"))] > 1


def _squash(text: str) -> str:
    return "".join(text.split()).casefold()


def _join_pieces(pieces: Sequence[tuple]) -> str:
    """Text leaves joined as laid out: no space between fragments that touch on one line
    ("wor" + "ld" of "wor<b>ld</b>"), one space otherwise (list items, cells, lines, and
    fragments whose own text ends or starts with a space)."""
    out, last = "", None
    for text, box in pieces:
        if out:
            touching = (not out[-1].isspace() and not text[0].isspace() and box is not None and last is not None and len(box) == 4 and len(last) == 4
                        and abs(float(box[1]) - float(last[1])) < 0.5 * max(1.0, float(last[3]) - float(last[1]))
                        and 0 <= float(box[0]) - float(last[2]) < 1.5)
            out += text if touching else " " + text
        else:
            out = text
        last = box
    return clean_text(out)


def glyph_problem(page: Mapping, text: Optional[str]) -> Optional[str]:
    """Why `text` cannot tie a sample to the screenshot: it holds a character no installed font
    could draw (the page row's glyphs_missing), which the screenshot shows as an empty box. Asked
    of the row, not of this machine's fonts, so a sample is the same wherever it is made."""
    missing = page.get("glyphs_missing")
    if missing and text and not set(missing).isdisjoint(text):
        return "text without a glyph"
    return None


# the bulk of a `pages` row, read by none of the rule or text-LLM tasks
BULK_FIELDS = ("html", "screenshot")


def light_page(page: Mapping) -> dict:
    """The page as the rule and text-LLM tasks read it: without its HTML and screenshot bytes (most
    of its size), with the screenshot's byte count in their place, so that a join which carries the
    page to its distractor pool or to the LLM draw does not carry (and hold) the bytes."""
    light = {k: v for k, v in page.items() if k not in BULK_FIELDS}
    light["screenshot_bytes"] = len(page.get("screenshot") or b"")
    return light


def page_problem(page: Mapping) -> Optional[str]:
    """Why a page yields no samples at all, or None (a full row, or its `light_page`)."""
    if page.get("kept") is False:
        return "page dropped by curation"
    has_png = page.get("screenshot") if "screenshot" in page else page.get("screenshot_bytes")
    if not has_png or not page.get("screenshot_width") or not page.get("screenshot_height"):
        return "page has no screenshot"
    return None


def make_sample(page: Mapping, task: str, template_id: int, question: str, answer: str, *,
                generator: str = RULE, target_node: Optional[int] = None, bbox: Optional[list] = None,
                box_px: Optional[Sequence[float]] = None) -> dict:
    """One `samples` row: a two-turn LLaVA conversation whose human turn starts with `<image>\\n`.

    The id hashes the page, task, target, template and the turns themselves, so a change in the
    options, the distractor pool or the model's words gives a new id.
    """
    if task not in schema.TASKS:
        raise ValueError(f"unknown multiui task {task!r}; expected one of {schema.TASKS}")
    return {
        "id": stable_id(page["id"], task, target_node, template_id, question, answer),
        "page_id": page["id"],
        "task": task,
        "platform": page["platform"],
        "template_id": int(template_id),
        "generator": generator,
        "conversations": [{"from": "human", "value": IMAGE_TOKEN + question},
                          {"from": "gpt", "value": answer}],
        "target_node": None if target_node is None else int(target_node),
        "bbox": None if bbox is None else [float(v) for v in bbox],
        "box_px": None if box_px is None else [int(round(float(v))) for v in box_px],
    }


def pick(candidates: Sequence[Mapping], limit: int, *seed_parts: Any) -> list:
    """At most `limit` candidates, a seeded draw kept in reading order (all of them when few)."""
    if len(candidates) <= limit:
        return list(candidates)
    chosen = rng_for(*seed_parts).sample(range(len(candidates)), limit)
    return [candidates[i] for i in sorted(chosen)]


def choose_nodes(out: "TaskOutput", index: "PageIndex", page: Mapping, task: str, limit: int,
                 considered: Callable[[Mapping], bool], problem_of: Callable[[Mapping], Optional[str]]) -> list:
    """A task's targets: of the nodes `considered`, those `problem_of` finds nothing wrong with (each
    problem counted as a skip in `out`), in reading order, drawn down to `limit` (the rest counted)."""
    candidates = []
    for node in index.nodes:
        if not considered(node):
            continue
        problem = problem_of(node)
        if problem:
            out.skip(problem)
        else:
            candidates.append(node)
    candidates = reading_order(candidates)
    chosen = pick(candidates, limit, page["id"], task, "pick")
    out.skip("over max_per_task", len(candidates) - len(chosen))
    return chosen


def rejected_page(page: Mapping, task: str, reason: str) -> Rejected:
    return Rejected(reason, {"page_id": page.get("id"), "task": task, "url": page.get("url")})


def grounding_problem(node: Mapping, index: "PageIndex", page: Mapping, rules: TaskRules) -> Optional[str]:
    """Why an element makes a poor grounding target (no name, a name the screenshot cannot show, a
    name its ancestor already says, too long, ambiguous on the page, a static fragment like "and", a
    box too small or off-screen), or None."""
    name = clean_text(node.get("name"))
    if not name:
        return "empty name"
    if index.is_shadow(node):
        return "repeats an ancestor's name"
    if len(name) > rules.max_grounding_chars:
        return "name too long for grounding"
    if not node.get("interactive") and (len(name) < rules.min_ocr_chars or not any(c.isalpha() for c in name)):
        return "trivial text"
    if index.is_duplicate(node):
        return "duplicate name on the page"
    return glyph_problem(page, name) or box_problem(node, page, rules.min_box_px)
