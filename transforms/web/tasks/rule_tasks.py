"""The four rule-made MultiUI tasks: heading OCR, element OCR, element grounding, action prediction.

Each reads one `pages` row and returns a TaskOutput (samples, skips by reason, bad input).
Targets come from the enhanced accessibility tree; a candidate is skipped, and counted,
when it breaks a quality rule (TaskRules): an empty name, a box under min_box_px or outside
the screenshot, a name too long to ask for, or, for grounding, a name that another element
on the page shares (the question would be ambiguous). At most `max_per_task` samples per
page and task, drawn with a seeded Random so that a rerun picks the same ones.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

from PIL import UnidentifiedImageError

from transforms.web.tasks import templates
from transforms.web.tasks.draw import draw_box_on, open_rgb
from transforms.web.tasks.elements import (GROUNDING_ROLES, TEXT_ROLES, PageIndex, TaskOutput, TaskRules,
                                           box_problem, clean_text, describe, format_box, is_heading,
                                           make_sample, name_key, norm_bbox, page_problem, pick, reading_order,
                                           grounding_problem, rejected_page, rng_for, role_of)

OPTION_LETTERS = "ABCDEFGH"
DISTRACTORS = len(OPTION_LETTERS) - 1
MAX_TITLE_CHARS = 150
RULE_TASKS = ("heading_ocr", "element_ocr", "element_grounding", "action_prediction")


def _start(page: Mapping, task: str) -> tuple[TaskOutput, Optional[PageIndex]]:
    out = TaskOutput(task)
    problem = page_problem(page)
    if problem:
        out.skip(problem)
        return out, None
    return out, PageIndex(page)


def heading_ocr(page: Mapping, rules: TaskRules = TaskRules()) -> TaskOutput:
    """Heading nodes -> "what does the heading at [box] say?" -> the heading's text.

    The box in the question tells which heading is meant; the first max_per_task headings in
    reading order are used (the page's main headings come first).
    """
    out, index = _start(page, "heading_ocr")
    if index is None:
        return out
    candidates = []
    for node in index.nodes:
        if not is_heading(node):
            continue
        text = clean_text(node.get("name"))
        problem = box_problem(node, page, rules.min_box_px)
        if not text:
            out.skip("empty name")
        elif len(text) > rules.max_ocr_chars:
            out.skip("text too long")
        elif problem:
            out.skip(problem)
        else:
            candidates.append(node)
    ordered = reading_order(candidates)
    out.skip("over max_per_task", max(0, len(ordered) - rules.max_per_task))
    for node in ordered[: rules.max_per_task]:
        bbox = norm_bbox(node)
        template_id, question = templates.instruction("heading_ocr", page["id"], int(node["node_id"]),
                                                      box=format_box(bbox))
        out.samples.append(make_sample(page, "heading_ocr", template_id, question, clean_text(node["name"]),
                                       target_node=int(node["node_id"]), bbox=bbox))
    return out


def _ocr_candidate_problem(node: Mapping, index: PageIndex, page: Mapping, rules: TaskRules) -> Optional[str]:
    text = clean_text(node.get("name"))
    if not text:
        return "empty name"
    if index.is_shadow(node):
        return "repeats an ancestor's name"
    if (len(text) < rules.min_ocr_chars or not any(c.isalpha() for c in text)
            or (len(text.split()) < 2 and len(text) < 12)):  # one short word: nothing to read
        return "trivial text"
    if len(text) > rules.max_ocr_chars:
        return "text too long"
    return box_problem(node, page, rules.min_box_px)


def element_ocr(page: Mapping, rules: TaskRules = TaskRules()) -> TaskOutput:
    """A non-trivial text element framed by a 3 px pure red box on a copy of the screenshot;
    the sample's `image` is that copy and the answer is the element's text."""
    out, index = _start(page, "element_ocr")
    if index is None:
        return out
    candidates = []
    for node in index.nodes:
        if role_of(node) not in TEXT_ROLES:
            continue
        problem = _ocr_candidate_problem(node, index, page, rules)
        if problem:
            out.skip(problem)
        else:
            candidates.append(node)
    candidates = reading_order(candidates)
    chosen = pick(candidates, rules.max_per_task, page["id"], "element_ocr", "pick")
    out.skip("over max_per_task", len(candidates) - len(chosen))
    if not chosen:
        return out
    try:
        screenshot = open_rgb(page["screenshot"])
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        out.rejected.append(rejected_page(page, "element_ocr", f"screenshot is not a readable PNG: {exc}"))
        return out
    for node in chosen:
        try:
            image = draw_box_on(screenshot, node["box"])
        except ValueError:
            out.skip("box outside the screenshot")
            continue
        template_id, question = templates.instruction("element_ocr", page["id"], int(node["node_id"]))
        out.samples.append(make_sample(page, "element_ocr", template_id, question, clean_text(node["name"]),
                                       target_node=int(node["node_id"]), bbox=norm_bbox(node), image=image))
    return out


def element_grounding(page: Mapping, rules: TaskRules = TaskRules()) -> TaskOutput:
    """"Where is the button "Sign in"?" -> its normalised box, "[0.123, 0.456, 0.789, 0.900]"."""
    out, index = _start(page, "element_grounding")
    if index is None:
        return out
    candidates = []
    for node in index.nodes:
        if role_of(node) not in GROUNDING_ROLES:
            continue
        problem = grounding_problem(node, index, page, rules)
        if problem:
            out.skip(problem)
        else:
            candidates.append(node)
    candidates = reading_order(candidates)
    chosen = pick(candidates, rules.max_per_task, page["id"], "element_grounding", "pick")
    out.skip("over max_per_task", len(candidates) - len(chosen))
    for node in chosen:
        bbox = norm_bbox(node)
        template_id, question = templates.instruction("element_grounding", page["id"], int(node["node_id"]),
                                                      element=describe(node))
        out.samples.append(make_sample(page, "element_grounding", template_id, question, format_box(bbox),
                                       target_node=int(node["node_id"]), bbox=bbox))
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
                      rules: TaskRules = TaskRules()) -> TaskOutput:
    """A followed link from `actions`: which page would clicking it lead to? Eight options A-H:
    the true target title and 7 seeded distractors from other pages' titles; the answer is the
    letter and the title. Skipped when the pool has fewer than 7 distinct other titles."""
    out, index = _start(page, "action_prediction")
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
        else:
            problem = box_problem(node, page, rules.min_box_px)
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
                                       target_node=node_id, bbox=bbox))
    return out


def rule_samples(page: Mapping, distractor_titles: Sequence[str] = (),
               rules: TaskRules = TaskRules()) -> dict[str, TaskOutput]:
    """All four rule tasks for one page, by task name."""
    return {"heading_ocr": heading_ocr(page, rules), "element_ocr": element_ocr(page, rules),
            "element_grounding": element_grounding(page, rules),
            "action_prediction": action_prediction(page, distractor_titles, rules)}

