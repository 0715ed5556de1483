"""The four rule-made MultiUI tasks: heading OCR, element OCR, element grounding, action prediction.

Each reads one `pages` row and returns a TaskOutput (samples, skips by reason, bad input).
Targets come from the enhanced accessibility tree; a candidate is skipped, and counted,
when it breaks a quality rule (TaskRules): an empty name, a box under min_box_px or outside
the screenshot, a name too long to ask for, or, for grounding, a name that another element
on the page shares (the question would be ambiguous). At most `max_per_task` samples per
page and task, drawn with a seeded Random so that a rerun picks the same ones.

OCR answers are the text the screenshot shows (PageIndex.visible_text: the page's visible text
nodes), never an accessible name from aria-label, alt or title. Text holding a character the
screenshot shows as an empty box (the row's glyphs_missing) makes no sample: neither an OCR
answer nor an element a question names (elements.glyph_problem). Heading OCR is VisualWebBench's
page-level question about the main heading, one per page.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

from core.marks import mark_rect
from transforms.web.tasks import templates
from transforms.web.tasks.elements import (GROUNDING_ROLES, TEXT_ROLES, PageIndex, TaskOutput, TaskRules,
                                           box_problem, choose_nodes, clean_text, describe, format_box, glyph_problem,
                                           heading_level, is_heading, make_sample, name_key, norm_bbox, page_problem,
                                           pick, grounding_problem, rng_for, role_of)

OPTION_LETTERS = "ABCDEFGH"
DISTRACTORS = len(OPTION_LETTERS) - 1
MAX_TITLE_CHARS = 150
RULE_TASKS = ("heading_ocr", "element_ocr", "element_grounding", "action_prediction")


def _start(page: Mapping, task: str, index: Optional[PageIndex] = None) -> tuple[TaskOutput, Optional[PageIndex]]:
    out = TaskOutput(task)
    problem = page_problem(page)
    if problem:
        out.skip(problem)
        return out, None
    return out, index if index is not None else PageIndex(page)


def first_screen_px(page: Mapping) -> float:
    """Height of the first screen in screenshot pixels (what a visitor sees before scrolling)."""
    width = float(page.get("viewport_width") or 0)
    ratio = float(page.get("screenshot_width") or 0) / width if width else 1.0
    return float(page.get("viewport_height") or page.get("screenshot_height") or 0) * ratio


def heading_ocr(page: Mapping, rules: TaskRules = TaskRules(), index: Optional[PageIndex] = None) -> TaskOutput:
    """VisualWebBench's heading OCR: "the main text within the screenshot, which can be regarded
    as the heading of the webpage" -> its visible text. One question per page, without a box.

    The main heading is the highest-level heading (h1 before h2 ...; a role=heading without a tag
    last) that shows text in the first screen, the top-most among equals. A page without one
    in the first screen has no heading to ask about and is counted as skipped.
    """
    out, index = _start(page, "heading_ocr", index)
    if index is None:
        return out
    fold = first_screen_px(page)
    candidates = []
    for node in index.nodes:
        if not is_heading(node):
            continue
        text = index.visible_text(node)
        problem = box_problem(node, page, rules.min_box_px)
        if not text:
            out.skip("no visible text")
        elif len(text) > rules.max_ocr_chars:
            out.skip("text too long")
        elif problem:
            out.skip(problem)
        elif float(node["box"][1]) >= fold:
            out.skip("heading below the first screen")
        else:
            candidates.append(node)
    if not candidates:
        out.skip("no heading in the first screen")
        return out
    main = min(candidates, key=lambda n: (heading_level(n) or 7, float(n["box"][1]), int(n["node_id"])))
    out.skip("not the main heading", len(candidates) - 1)
    answer = index.visible_text(main)
    problem = glyph_problem(page, answer)   # skipped, not replaced: the next is no main heading
    if problem:
        out.skip(problem)
        return out
    template_id, question = templates.instruction("heading_ocr", page["id"], int(main["node_id"]))
    out.samples.append(make_sample(page, "heading_ocr", template_id, question, answer,
                                   target_node=int(main["node_id"]), bbox=norm_bbox(main), box_px=main["box"]))
    return out


def _ocr_candidate_problem(node: Mapping, index: PageIndex, page: Mapping, rules: TaskRules) -> Optional[str]:
    text = index.visible_text(node)
    if not text:
        return "no visible text"
    if index.repeats_ancestor_text(node):
        return "repeats an ancestor's text"
    if (len(text) < rules.min_ocr_chars or not any(c.isalpha() for c in text)
            or (len(text.split()) < 2 and len(text) < 12)):  # one short word: nothing to read
        return "trivial text"
    if len(text) > rules.max_ocr_chars:
        return "text too long"
    return glyph_problem(page, text) or box_problem(node, page, rules.min_box_px)


def element_ocr(page: Mapping, rules: TaskRules = TaskRules(), index: Optional[PageIndex] = None) -> TaskOutput:
    """A non-trivial text element framed by a 3 px pure red box; the answer is the text it shows
    (PageIndex.visible_text), not its accessible name.

    The sample stores the box (`box_px`), not a framed copy of the screenshot: readers draw the
    frame at load time (core/marks.py), so the samples table stays small and making
    the sample costs no image decode or encode."""
    out, index = _start(page, "element_ocr", index)
    if index is None:
        return out
    chosen = choose_nodes(out, index, page, "element_ocr", rules.max_per_task, lambda n: role_of(n) in TEXT_ROLES,
                          lambda n: _ocr_candidate_problem(n, index, page, rules))
    size = (int(page["screenshot_width"]), int(page["screenshot_height"]))
    for node in chosen:
        if mark_rect(node["box"], size) is None:
            out.skip("box outside the screenshot")
            continue
        template_id, question = templates.instruction("element_ocr", page["id"], int(node["node_id"]))
        out.samples.append(make_sample(page, "element_ocr", template_id, question, index.visible_text(node),
                                       target_node=int(node["node_id"]), bbox=norm_bbox(node),
                                       box_px=node["box"]))
    return out


def element_grounding(page: Mapping, rules: TaskRules = TaskRules(), index: Optional[PageIndex] = None) -> TaskOutput:
    """"Where is the button "Sign in"?" -> its normalised box, "[0.123, 0.456, 0.789, 0.900]"."""
    out, index = _start(page, "element_grounding", index)
    if index is None:
        return out
    chosen = choose_nodes(out, index, page, "element_grounding", rules.max_per_task,
                          lambda n: role_of(n) in GROUNDING_ROLES, lambda n: grounding_problem(n, index, page, rules))
    for node in chosen:
        bbox = norm_bbox(node)
        template_id, question = templates.instruction("element_grounding", page["id"], int(node["node_id"]),
                                                      element=describe(node))
        out.samples.append(make_sample(page, "element_grounding", template_id, question, format_box(bbox),
                                       target_node=int(node["node_id"]), bbox=bbox, box_px=node["box"]))
    return out


def distractor_pool(titles: Sequence[str], exclude: Sequence[str] = ()) -> list[str]:
    """Distinct usable titles (whitespace-collapsed, compared without case), sorted so that the
    draw does not depend on the order the pool arrived in."""
    excluded = {name_key(t) for t in exclude}
    pool: dict[str, str] = {}
    for title in titles:
        text, key = clean_text(title), name_key(title)
        if text and key not in excluded and len(text) <= MAX_TITLE_CHARS:
            pool[key] = min(pool.get(key, text), text)  # one spelling per title, whatever the order
    return sorted(pool.values(), key=lambda t: (t.casefold(), t))


def action_prediction(page: Mapping, distractor_titles: Sequence[str],
                      rules: TaskRules = TaskRules(), index: Optional[PageIndex] = None) -> TaskOutput:
    """A followed link from `actions`: which page would clicking it lead to? Eight options A-H:
    the true target title and 7 seeded distractors from other pages' titles; the answer is the
    letter and the title. Skipped when the pool has fewer than 7 distinct other titles."""
    out, index = _start(page, "action_prediction", index)
    if index is None:
        return out
    candidates, seen = [], set()
    for action in page.get("actions") or []:
        node_id = int(action["node_id"])
        if node_id in seen:
            out.skip("repeated action")
            continue
        seen.add(node_id)
        node = index.by_id.get(node_id)
        title = clean_text(action.get("target_title"))
        problem = None
        if node is None:
            problem = "action node not in the tree"
        elif not title:
            problem = "empty target title"
        elif len(title) > MAX_TITLE_CHARS:
            problem = "target title too long"
        else:   # the question names the element: its name must show
            problem = glyph_problem(page, node.get("name")) or box_problem(node, page, rules.min_box_px)
        if problem:
            out.skip(problem)
        else:
            candidates.append((node, title))
    chosen = pick(candidates, rules.max_per_task, page["id"], "action_prediction", "pick")
    out.skip("over max_per_task", len(candidates) - len(chosen))
    for node, title in chosen:
        pool = distractor_pool(distractor_titles, exclude=[title])
        if len(pool) < DISTRACTORS:
            out.skip(f"fewer than {DISTRACTORS} distinct distractor titles")
            continue
        node_id = int(node["node_id"])
        rng = rng_for(page["id"], "action_prediction", node_id, "options")
        options = [title] + rng.sample(pool, DISTRACTORS)
        rng.shuffle(options)
        letter = OPTION_LETTERS[options.index(title)]
        bbox = norm_bbox(node)
        template_id, question = templates.instruction("action_prediction", page["id"], node_id,
                                                      element=describe(node), box=format_box(bbox))
        question += "\n" + "\n".join(f"{OPTION_LETTERS[i]}. {option}" for i, option in enumerate(options))
        question += "\nAnswer with the option's letter and title."
        out.samples.append(make_sample(page, "action_prediction", template_id, question, f"{letter}. {title}",
                                       target_node=node_id, bbox=bbox, box_px=node["box"]))
    return out


def rule_samples(page: Mapping, distractor_titles: Sequence[str] = (),
               rules: TaskRules = TaskRules()) -> dict[str, TaskOutput]:
    """All four rule tasks for one page, by task name; one PageIndex (tree walks, texts) for all."""
    index = PageIndex(page) if page_problem(page) is None else None
    return {"heading_ocr": heading_ocr(page, rules, index), "element_ocr": element_ocr(page, rules, index),
            "element_grounding": element_grounding(page, rules, index),
            "action_prediction": action_prediction(page, distractor_titles, rules, index)}
