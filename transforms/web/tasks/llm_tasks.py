"""The LLM-made MultiUI tasks: prompts out of a page, samples out of a model's completion.

Text tasks (any LLM backend, prompts built from the accessibility tree as text):
  webpage_caption   the model describes the page; human turn = a caption template.
  webpage_qa        the model writes question/answer pairs in a strict format:
                        Q: <question>
                        A: <answer>
                    one sample per pair, the question wrapped in a QA template.
  action_grounding  the model writes the instruction a user would give to act on one
                    interactive element; the answer is that element's box (from the tree,
                    never from the model).

Each `*_requests(page, ...)` returns a TaskOutput whose `requests` are (Request, meta) pairs;
`meta` is small plain data (page id, platform, task, target, box, cap) that travels with the
request, so `parse_completion(meta, completion)` needs no page. A parser returns a list of
`samples` rows, or a Rejected naming what was wrong with the output (empty, refused, no
Q/A pair, cut off, a generation loop, prose instead of an instruction, a copy of the prompt's
example) for the dead-letter table. Near-misses of the format are read, not rejected (see the
comment above _LIST_MARK). generator = "llm:" + completion.model.

Vision tasks (embedded_image_caption, embedded_image_qa) need a model that sees the image.
Without one, `embedded_image_tasks(page, vision=False)` counts the images left undone as a skip
("needs a vision-capable backend"); it never makes a sample from alt text or any other stand-in.
With a vision backend, `vision_requests` builds chat Requests whose user content holds a text
part and an `image_url` part with a data: URL of the cropped image (PNG, base64), which the
OpenAI backend sends as they are. Their completions parse with the same `parse_completion`.
"""
from __future__ import annotations

import base64
import dataclasses
import io
import re
from typing import Any, Mapping, Optional, Union

from PIL import Image

from transforms.io.ids import stable_id
from core.rejected import Rejected
from transforms.llm.requests import MAX_SEED, Completion, Request, Sampling
from transforms.text.self_instruct import REFUSALS
from transforms.web.tasks import templates
from transforms.web.tasks.elements import (GROUNDING_ROLES, IMAGE_ROLES, PageIndex, TaskOutput, TaskRules,
                                           box_problem, clean_text, describe, format_box, make_sample,
                                           grounding_problem, norm_bbox, page_problem, pick, reading_order,
                                           role_of)
from transforms.web.tasks.tree_text import tree_text

LLM_TASKS = ("webpage_caption", "webpage_qa", "action_grounding")
VISION_TASKS = ("embedded_image_caption", "embedded_image_qa")
MIN_CAPTION_WORDS = {"webpage_caption": 12, "embedded_image_caption": 3}
MAX_QUESTION_CHARS = 300
MAX_ANSWER_CHARS = 1000
MAX_INSTRUCTION_CHARS = 200
COPIED = "copies the prompt's example page"

# Small models write the asked-for format with variations: "**Q1:**", "1. Question:", "Q. ...",
# "Q: ...? A: ..." on one line, a numbered question with its answer below and no labels. The
# parsers accept these near-misses (tests/data/multiui_llm_outputs.json holds real ones) rather than
# throw the completion away; what is still unreadable becomes a Rejected with the text.
_LIST_MARK = r"(?:[-*•>]\s*|\(?\d{1,2}[.)]\s*|#{1,6}\s*)?"
_Q_LINE = re.compile(rf"^\s*{_LIST_MARK}(?:Q|Question)\s*\d*\s*(?:[:：.)]|\s-|\s(?=\S.*\?\s*$))\s*(.*)$",
                     re.IGNORECASE)
_A_LINE = re.compile(rf"^\s*{_LIST_MARK}(?:A|Answer)\s*\d*\s*(?:[:：.)]|\s-)\s*(.*)$", re.IGNORECASE)
_INLINE_A = re.compile(r"\s(?:A|Answer)\s*\d*\s*[:：]\s*", re.IGNORECASE)
_NUMBERED_Q = re.compile(r"^\s*(?:\d{1,2}[.)]|[-*•])\s+(.+?\?)\s*(.*)$")
_MARKUP = re.compile(r"\*\*|__")
_LABEL = re.compile(r"^\s*(?:#{1,6}\s*)?(?:(?:webpage|page|image)\s+)?(?:caption|description|instruction)\s*\d*"
                    r"\s*[:：]\s*", re.IGNORECASE)
_BULLET = re.compile(r"^\s*(?:[-*•]|\d{1,2}[.)])\s+")
_HEADING = re.compile(r"^\s*#{1,6}\s+\S.*$")
_TREE_BOX = re.compile(r"\s*\[\d+(?:\.\d+)?(?:\s*,\s*\d+(?:\.\d+)?){3}\]")
_QUOTES = "\"'`“”‘’ "
_COORDINATES = re.compile(r"[\[(]\s*\d+(?:\.\d+)?\s*,\s*\d+(?:\.\d+)?")
_SENTENCE_END = re.compile(r"[.!?。](?=\s|$)")

SYSTEM = ("You help build a dataset for teaching a vision-language model to understand webpages. "
          "You see a webpage as its accessibility tree: one line per element, indented by nesting, "
          "'*' marks interactive elements, and [left,top,right,bottom] is the element's box in "
          "screenshot pixels. Use only what the tree shows.")


def _page_header(page: Mapping) -> str:
    return (f"Platform: {page.get('platform')} ({page.get('screenshot_width')}x{page.get('screenshot_height')} px)\n"
            f"Title: {clean_text(page.get('title')) or '(none)'}\nURL: {page.get('final_url') or page.get('url') or ''}")


def _meta(page: Mapping, task: str, target_node: Optional[int] = None, bbox: Optional[list] = None,
          max_samples: int = 1, **extra: Any) -> dict:
    return {"task": task, "page_id": page["id"], "platform": page["platform"], "target_node": target_node,
            "bbox": bbox, "max_samples": max_samples, **extra}


def _request(page: Mapping, task: str, target: Any, messages: tuple, sampling: Sampling) -> Request:
    """A chat request whose id and sampling seed derive from (page, task, target)."""
    request_id = stable_id("multiui", page["id"], task, target)
    seed = (sampling.seed + int(request_id, 16)) % (MAX_SEED + 1)
    return Request(request_id, messages, dataclasses.replace(sampling, seed=seed))


def _start(page: Mapping, task: str) -> tuple[TaskOutput, bool]:
    out = TaskOutput(task)
    problem = page_problem(page)
    if problem:
        out.skip(problem)
    return out, problem is None


# -- requests ---------------------------------------------------------------------------------

# Action grounding shows a worked example, sent as an earlier user/assistant exchange: a small model
# (the default SmolLM2-135M) copies a shown answer's shape far more reliably than it follows a
# described format (on 4 bundled pages, unusable instructions fell from 28 of 32 to 7). The example
# page is made up and short (sent 8 times a page); output that copies its content is rejected
# (EXAMPLE_WORDS). Stop at a blank line: an instruction is one line, and what the model adds after
# it only costs tokens. Caption and QA show none: given one, the model wrote the example back with
# the name changed, or one stray question, more often than without.
EXAMPLE_HEADER = ("Platform: desktop (1280x900 px)\nTitle: Acme Bakery | Fresh bread daily\n"
                  "URL: https://acme-bakery.example/")
EXAMPLE_CONTEXT = ('  StaticText "Sourdough loaf $6" [80,260,300,284]\n  *button "Add to basket" [320,256,460,288]')
EXAMPLE_TARGET = 'button "Add to basket" [320,256,460,288]'
EXAMPLE_INSTRUCTION = "Add a sourdough loaf to my basket."
CAPTION_ASK = ("Write a caption of this webpage as if describing its screenshot: what the page is for, its "
               "layout, its main sections and content, in 3 to 5 sentences of plain prose. Reply with the "
               "caption only.")
INSTRUCTION_ASK = ("Write one short instruction (at most 15 words) that a user of this page might give, which is "
                   "carried out by clicking or using exactly this element. Do not mention coordinates, the tree "
                   "or the element's role. Reply in the form:\nInstruction: <instruction>")
# Words of the example page: output that uses one the real page lacks copied the example (the
# default model does: "Add a pickup to our gift basket.").
EXAMPLE_WORDS = frozenset({"acme", "bakery", "bread", "sourdough", "loaf", "basket"})
_WORD = re.compile(r"\w+")


def example_words_missing(page: Mapping, tree: str) -> list[str]:
    """The example page's words that this page's title and tree do not hold (small, so it travels
    in the request's meta to the parser, which never sees the page)."""
    words = set(_WORD.findall(f"{page.get('title') or ''} {tree}".casefold()))
    return sorted(EXAMPLE_WORDS - words)


def copies_example(text: str, meta: Mapping) -> bool:
    """Whether model output uses a word of the prompt's example that the page itself lacks."""
    missing = meta.get("example_words") or ()
    return bool(missing) and not set(missing).isdisjoint(_WORD.findall(text.casefold()))


def _qa_ask(pairs: int) -> str:
    return (f"Write {pairs} different question-answer pairs about this webpage that a person looking at its "
            "screenshot could answer: facts stated on the page, what a section or control is for, simple "
            "reasoning over the content. Do not mention the accessibility tree, node roles or pixel "
            "coordinates. Use exactly this format, one pair after another:\nQ: <question>\nA: <answer>")


def _messages(example_user: str, example_answer: str, user: str) -> tuple:
    return ({"role": "system", "content": SYSTEM}, {"role": "user", "content": example_user},
            {"role": "assistant", "content": example_answer}, {"role": "user", "content": user})


def caption_requests(page: Mapping, sampling: Sampling = Sampling(max_tokens=400),
                     tree_chars: int = 6000) -> TaskOutput:
    """One request per page: describe the page from its tree."""
    out, ok = _start(page, "webpage_caption")
    tree = tree_text(page.get("nodes") or [], tree_chars) if ok else ""
    if ok and not tree:
        out.skip("empty accessibility tree")
    if not tree:
        return out
    messages = ({"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"{_page_header(page)}\nAccessibility tree:\n{tree}\n\n{CAPTION_ASK}"})
    out.requests.append((_request(page, "webpage_caption", None, messages, sampling),
                         _meta(page, "webpage_caption")))
    return out


def qa_requests(page: Mapping, sampling: Sampling = Sampling(max_tokens=600), pairs: int = 4,
                tree_chars: int = 6000, rules: TaskRules = TaskRules()) -> TaskOutput:
    """One request per page asking for `pairs` Q/A pairs in the strict `Q: ...` / `A: ...` format."""
    out, ok = _start(page, "webpage_qa")
    tree = tree_text(page.get("nodes") or [], tree_chars) if ok else ""
    if ok and not tree:
        out.skip("empty accessibility tree")
    if not tree:
        return out
    messages = ({"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"{_page_header(page)}\nAccessibility tree:\n{tree}\n\n{_qa_ask(pairs)}"})
    out.requests.append((_request(page, "webpage_qa", None, messages, sampling),
                         _meta(page, "webpage_qa", max_samples=rules.max_per_task)))
    return out


def action_grounding_requests(page: Mapping, sampling: Sampling = Sampling(max_tokens=60),
                              rules: TaskRules = TaskRules(), context_chars: int = 1000) -> TaskOutput:
    """One request per chosen interactive element: write the instruction a user would give."""
    out, ok = _start(page, "action_grounding")
    if not ok:
        return out
    index = PageIndex(page)
    candidates = []
    for node in index.nodes:
        if not node.get("interactive"):
            continue
        problem = "not a named control" if role_of(node) not in GROUNDING_ROLES else \
            grounding_problem(node, index, page, rules)
        if problem:
            out.skip(problem)
        else:
            candidates.append(node)
    candidates = reading_order(candidates)
    chosen = pick(candidates, rules.max_per_task, page["id"], "action_grounding", "pick")
    out.skip("over max_per_task", len(candidates) - len(chosen))
    example = (f"{EXAMPLE_HEADER}\nPart of the accessibility tree:\n{EXAMPLE_CONTEXT}\n\n"
               f"Target element: {EXAMPLE_TARGET}\n\n{INSTRUCTION_ASK}")
    sampling = sampling if sampling.stop else dataclasses.replace(sampling, stop=("\n\n",))
    for node in chosen:
        node_id = int(node["node_id"])
        context = tree_text(index.nodes, context_chars, focus=node_id)
        box = ",".join(str(int(round(float(v)))) for v in node["box"])
        user = (f"{_page_header(page)}\nPart of the accessibility tree:\n{context}\n\n"
                f"Target element: {node.get('role')} \"{clean_text(node.get('name'))}\" [{box}]\n\n{INSTRUCTION_ASK}")
        messages = _messages(example, f"Instruction: {EXAMPLE_INSTRUCTION}", user)
        out.requests.append((_request(page, "action_grounding", node_id, messages, sampling),
                             _meta(page, "action_grounding", node_id, norm_bbox(node), element=describe(node),
                                   example_words=example_words_missing(page, context))))
    return out


def llm_requests(page: Mapping, rules: TaskRules = TaskRules(), **sampling: Sampling) -> dict[str, TaskOutput]:
    """The three text-LLM tasks' requests for one page; sampling per task by keyword
    (webpage_caption=Sampling(...), ...), defaults otherwise."""
    return {"webpage_caption": caption_requests(page, **_only(sampling, "webpage_caption")),
            "webpage_qa": qa_requests(page, rules=rules, **_only(sampling, "webpage_qa")),
            "action_grounding": action_grounding_requests(page, rules=rules, **_only(sampling, "action_grounding"))}


def _only(sampling: Mapping, task: str) -> dict:
    return {"sampling": sampling[task]} if task in sampling else {}


# -- parsing ----------------------------------------------------------------------------------

def _page_of(meta: Mapping) -> dict:
    return {"id": meta["page_id"], "platform": meta["platform"]}


def _excerpt(completion: Completion) -> dict:
    return {"request_id": completion.request_id, "model": completion.model, "text": completion.text[:300],
            "finish_reason": completion.finish_reason}


def _common_problem(text: str) -> Optional[str]:
    if not text.strip():
        return "empty model output"
    if REFUSALS.search(text[:200]):
        return "model refused"
    return None


def caption_text(text: str) -> str:
    """The caption in a completion, as prose: a "Caption:" label, short markdown headings, bold
    and list marks taken out (list items joined as sentences), and pixel boxes copied from the tree
    dropped, since a screenshot caption never shows them."""
    kept = []
    for raw in text.splitlines():
        line = _TREE_BOX.sub("", _MARKUP.sub("", raw)).strip()
        if not kept:
            line = _LABEL.sub("", line, count=1).strip()
        if not line or (_HEADING.match(line) and len(line.split()) <= 5):
            continue
        if _BULLET.match(line):
            line = _BULLET.sub("", line)
            line = line if line[-1] in ".!?:;" else line + "."
        kept.append(line)
    return " ".join(kept).strip()


def repetitive(text: str, n: int = 3, min_words: int = 24) -> bool:
    """Whether a text loops ("a variety of services, a variety of services, ..."), as small models
    do near max_tokens: fewer than half of its word n-grams are distinct. Such a caption teaches
    nothing about the page."""
    words = re.findall(r"\w+", text.casefold())
    if len(words) < min_words:
        return False
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return len(set(grams)) < 0.5 * len(grams)


def parse_caption(meta: Mapping, completion: Completion) -> Union[list, Rejected]:
    """webpage_caption / embedded_image_caption: the completion is the caption."""
    task, text = meta["task"], caption_text(completion.text)
    problem = _common_problem(text)
    if problem:
        return Rejected(problem, _excerpt(completion))
    if completion.finish_reason == "length":
        ends = list(_SENTENCE_END.finditer(text))
        text = text[: ends[-1].end()] if ends else ""
    if len(text.split()) < MIN_CAPTION_WORDS[task]:
        reason = "caption cut off at max_tokens" if completion.finish_reason == "length" else "caption too short"
        return Rejected(reason, _excerpt(completion))
    if repetitive(text):
        return Rejected("caption repeats itself (a generation loop)", _excerpt(completion))
    if copies_example(text, meta):
        return Rejected(COPIED, _excerpt(completion))
    bbox = meta.get("bbox")
    template_id, question = templates.instruction(task, meta["page_id"], meta.get("target_node"),
                                                  box=format_box(bbox) if bbox else "")
    return [make_sample(_page_of(meta), task, template_id, question, text, generator="llm:" + completion.model,
                        target_node=meta.get("target_node"), bbox=bbox)]


def qa_pairs(text: str) -> list[tuple[str, str]]:
    """(question, answer) pairs from `Q: ...` / `A: ...` lines and their near-misses.

    An answer runs until the next question or a blank line (so an epilogue such as "I hope this
    helps" is not glued to the last answer); a line after a question that ends in "?" is taken as
    its answer even without the `A:` label. A question on the same line as its answer, numbered
    questions without labels, list marks and markdown bold are read too. Text before the first
    question, and a question without an answer, are dropped."""
    pairs: list[list[str]] = []
    question: Optional[str] = None
    answer: Optional[str] = None

    def close():
        nonlocal question, answer
        if question is not None and answer is not None and answer.strip():
            pairs.append([question, answer])
        question = answer = None

    for raw in text.splitlines():
        line = _MARKUP.sub("", raw).rstrip()
        q_match, a_match = _Q_LINE.match(line), _A_LINE.match(line)
        numbered = _NUMBERED_Q.match(line) if not (q_match or a_match) else None
        if q_match or numbered:
            close()
            head = q_match.group(1) if q_match else numbered.group(1) + " " + numbered.group(2)
            question, answer = _split_inline(head)
        elif a_match:
            if question is not None and answer is None:
                answer = a_match.group(1)      # a second answer to one question is dropped
        elif not line.strip():
            if answer is not None and answer.strip():
                close()
        elif question is not None:
            if answer is not None:
                answer = (answer + "\n" + line.strip()).strip()
            elif question.rstrip().endswith("?") and not line.rstrip().endswith("?"):
                answer = line.strip()          # the answer line lost its "A:" label
            else:
                question += " " + line.strip()
    close()
    return [(clean_text(q).strip(_QUOTES), a.strip().strip(_QUOTES).strip()) for q, a in pairs]


def _split_inline(text: str) -> tuple[str, Optional[str]]:
    """A question line that also holds its answer ("What ...? A: Yes", "What ...? Yes") -> both."""
    labelled = _INLINE_A.search(text)
    if labelled:
        return text[: labelled.start()].strip(), text[labelled.end():].strip()
    mark = text.find("? ")
    if 0 <= mark < len(text) - 2 and not text.rstrip().endswith("?"):
        return text[: mark + 1].strip(), text[mark + 2:].strip()
    return text.strip(), None


def parse_qa(meta: Mapping, completion: Completion) -> Union[list, Rejected]:
    """webpage_qa / embedded_image_qa: one sample per well-formed Q/A pair, at most max_samples."""
    task, text = meta["task"], completion.text
    problem = _common_problem(text)
    if problem:
        return Rejected(problem, _excerpt(completion))
    pairs = qa_pairs(text)
    if completion.finish_reason == "length" and pairs:
        pairs = pairs[:-1]  # the last answer may be cut mid-sentence
    kept, seen = [], set()
    for question, answer in pairs:
        if (not question or not answer.strip() or len(question) > MAX_QUESTION_CHARS
                or len(answer) > MAX_ANSWER_CHARS or question.casefold() in seen or REFUSALS.search(answer)
                or repetitive(answer) or copies_example(question + " " + answer, meta)):
            continue
        seen.add(question.casefold())
        kept.append((question, answer))
    if not kept:
        return Rejected("no Q/A pair in model output", _excerpt(completion))
    bbox, samples = meta.get("bbox"), []
    for question, answer in kept[: max(1, int(meta.get("max_samples") or 1))]:
        target = question if meta.get("target_node") is None else [meta["target_node"], question]
        template_id, human = templates.instruction(task, meta["page_id"], target, question=question,
                                                   box=format_box(bbox) if bbox else "")
        samples.append(make_sample(_page_of(meta), task, template_id, human, answer,
                                   generator="llm:" + completion.model, target_node=meta.get("target_node"),
                                   bbox=bbox))
    return samples


_NOT_INSTRUCTION = re.compile(r"^(?:this (?:is|page|website|instruction|element)|here(?: is|'s)|"
                              r"i(?:'m|'d| am| would)?\b|hello|hi\b|the (?:task|element|page|webpage|website|information|user|anchor)\b|"
                              r"what an?\b|you are\b|title\b|to illustrate\b)", re.IGNORECASE)
_WORDS = re.compile(r"[^\W\d_]{2,}")


def instruction_text(text: str) -> Optional[tuple[str, bool]]:
    """The instruction in a completion: the text after an `Instruction:` label (on its line or the
    next), else the completion's only line; markdown, list marks, quotes and a pixel box copied
    from the prompt taken out; with whether a line break ends it (a cut at max_tokens left it
    whole). None when there is no label and more than one line: a small model that wanders writes
    prose whose first line is seldom an instruction."""
    text = _MARKUP.sub("", text)
    labelled = re.search(r"instructions?\s*\d*\s*[:：]\s*(\S.*)", text, re.IGNORECASE)
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    if labelled:
        line, whole = labelled.group(1), "\n" in text[labelled.end(1):]
    elif len(lines) == 1 or (len(lines) == 2 and _TREE_BOX.fullmatch(" " + lines[1])):
        line, whole = lines[0], len(lines) == 2
    else:
        return None
    line = _TREE_BOX.sub("", _BULLET.sub("", line))
    return clean_text(line).strip(_QUOTES + "*"), whole


def parse_instruction(meta: Mapping, completion: Completion) -> Union[list, Rejected]:
    """action_grounding: the model's instruction -> "where to act?" -> the element's box."""
    text = completion.text.strip()
    problem = _common_problem(text)
    if problem:
        return Rejected(problem, _excerpt(completion))
    found = instruction_text(text)
    if found is None:
        return Rejected("no Instruction: line in model output", _excerpt(completion))
    instruction, whole = found
    if len(_WORDS.findall(instruction)) < 2:
        return Rejected("instruction too short", _excerpt(completion))
    if len(instruction) > MAX_INSTRUCTION_CHARS or (completion.finish_reason == "length" and not whole
                                                     and not _SENTENCE_END.search(instruction + " ")):
        return Rejected("instruction too long", _excerpt(completion))
    if _COORDINATES.search(instruction):
        return Rejected("instruction gives coordinates", _excerpt(completion))
    if _NOT_INSTRUCTION.match(instruction):
        return Rejected("not an instruction (describes the page or chats)", _excerpt(completion))
    if copies_example(instruction, meta):
        return Rejected(COPIED, _excerpt(completion))
    bbox = meta["bbox"]
    template_id, question = templates.instruction("action_grounding", meta["page_id"], meta["target_node"],
                                                  instruction=instruction)
    return [make_sample(_page_of(meta), "action_grounding", template_id, question, format_box(bbox),
                        generator="llm:" + completion.model, target_node=meta["target_node"], bbox=bbox)]


PARSERS = {"webpage_caption": parse_caption, "embedded_image_caption": parse_caption,
           "webpage_qa": parse_qa, "embedded_image_qa": parse_qa, "action_grounding": parse_instruction}


def parse_completion(meta: Mapping, completion: Completion) -> Union[list, Rejected]:
    """Samples from one completion of a request planned above, or the Rejected reason."""
    return PARSERS[meta["task"]](meta, completion)


# -- vision -----------------------------------------------------------------------------------

def embedded_images(page: Mapping, rules: TaskRules = TaskRules()) -> list:
    """Image nodes big enough to describe, inside the screenshot, in reading order."""
    nodes = [n for n in page.get("nodes") or []
             if (role_of(n) in IMAGE_ROLES or str(n.get("tag") or "").lower() == "img")
             and box_problem(n, page, rules.min_image_px) is None]
    return reading_order(nodes)


def crop_png(png: bytes, box_px, max_side: int = 768) -> bytes:
    """The box cut out of the screenshot as PNG, scaled down so its longer side is <= max_side."""
    with Image.open(io.BytesIO(png)) as opened:
        image = opened.convert("RGB")
    left, top, right, bottom = (int(round(float(v))) for v in box_px)
    crop = image.crop((max(0, left), max(0, top), min(image.width, right), min(image.height, bottom)))
    if max(crop.size) > max_side:
        crop.thumbnail((max_side, max_side), Image.LANCZOS)
    buffer = io.BytesIO()
    crop.save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def vision_requests(page: Mapping, task: str = "embedded_image_caption", sampling: Sampling = Sampling(max_tokens=300),
                    rules: TaskRules = TaskRules(), pairs: int = 3) -> TaskOutput:
    """Chat Requests with the cropped image for a page's embedded images (caption or QA), for a vision
    backend only."""
    if task not in VISION_TASKS:
        raise ValueError(f"vision_requests task must be one of {VISION_TASKS}, got {task!r}")
    out, ok = _start(page, task)
    if not ok:
        return out
    images = embedded_images(page, rules)
    if not images:
        out.skip("no embedded images")
        return out
    chosen = pick(images, rules.max_per_task, page["id"], task, "pick")
    out.skip("over max_per_task", len(images) - len(chosen))
    for node in chosen:
        node_id = int(node["node_id"])
        alt = clean_text(node.get("alt") or node.get("name"))
        hint = f" Its alt text, which may be missing or wrong, is: \"{alt}\"." if alt else ""
        if task == "embedded_image_caption":
            ask = ("Describe this image in one to three sentences: what it shows, and any text in it." + hint
                   + " Reply with the description only.")
        else:
            ask = (f"Write {pairs} question-answer pairs about what this image shows, answerable by looking "
                   f"at it.{hint} Use exactly this format:\nQ: <question>\nA: <answer>\n")
        try:
            url = data_url(crop_png(page["screenshot"], node["box"]))
        except OSError as exc:
            out.rejected.append(Rejected(f"screenshot is not a readable PNG: {exc}",
                                         {"page_id": page["id"], "task": task}))
            return out
        context = f"This image is part of a {page['platform']} webpage titled \"{clean_text(page.get('title'))}\". "
        messages = ({"role": "user", "content": [{"type": "text", "text": context + ask},
                                                  {"type": "image_url", "image_url": {"url": url}}]},)
        request_id = stable_id("multiui", page["id"], task, node_id)
        seed = (sampling.seed + int(request_id, 16)) % (MAX_SEED + 1)
        out.requests.append((Request(request_id, messages, dataclasses.replace(sampling, seed=seed)),
                             _meta(page, task, node_id, norm_bbox(node),
                                   max_samples=rules.max_per_task if task == "embedded_image_qa" else 1)))
    return out


NEEDS_VISION = "needs a vision-capable backend (vision_base_url): images not used"


def embedded_image_tasks(page: Mapping, vision: bool = False, rules: TaskRules = TaskRules(),
                         sampling: Sampling = Sampling(max_tokens=300)) -> dict[str, TaskOutput]:
    """Both vision tasks for a page. Without a vision backend: no samples and no requests, one
    skip per task counting the images left undone."""
    outputs = {}
    for task in VISION_TASKS:
        if vision:
            outputs[task] = vision_requests(page, task, sampling, rules)
            continue
        out, ok = _start(page, task)
        count = len(embedded_images(page, rules)) if ok else 0
        if ok and not count:
            out.skip("no embedded images")
        elif count:
            out.skip(NEEDS_VISION, count)
        outputs[task] = out
    return outputs
