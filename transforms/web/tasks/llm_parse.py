"""Samples out of a model's completion for the LLM-written MultiUI tasks (text and vision).

`parse_completion(meta, completion)` reads a completion with the meta its request carried. A parser
returns a list of `samples` rows, or a Rejected naming what was wrong with the output (empty,
refused, no Q/A pair, cut off, a generation loop, prose instead of an instruction, a copy of the
prompt's example) for the dead-letter table. Near-misses of the format are read, not rejected (see
the comment above _LIST_MARK). generator = "llm:" + completion.model.
"""
from __future__ import annotations

import re
from typing import Mapping, Optional, Union

from core.rejected import Rejected
from transforms.llm.requests import Completion
from transforms.text.self_instruct import REFUSALS
from transforms.web.tasks import templates
from transforms.web.tasks.elements import clean_text, format_box, make_sample
from transforms.web.tasks.llm_tasks import WORD

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


def copies_example(text: str, meta: Mapping) -> bool:
    """Whether model output uses a word of the prompt's example that the page itself lacks."""
    missing = meta.get("example_words") or ()
    return bool(missing) and not set(missing).isdisjoint(WORD.findall(text.casefold()))



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
