"""The LLM-written MultiUI text tasks: the prompts out of a page.

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
request, so the parser (llm_parse.py) needs no page. The tasks that need a model that sees the
image are in vision_tasks.py.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Optional

from transforms.io.ids import stable_id
from transforms.llm.requests import MAX_SEED, Request, Sampling
from transforms.web.tasks.elements import (GROUNDING_ROLES, PageIndex, TaskOutput, TaskRules, choose_nodes,
                                           clean_text, describe, grounding_problem, norm_bbox, page_problem, role_of)
from transforms.web.tasks.tree_text import tree_text

LLM_TASKS = ("webpage_caption", "webpage_qa", "action_grounding")
VISION_TASKS = ("embedded_image_caption", "embedded_image_qa")
SYSTEM = ("You help build a dataset for teaching a vision-language model to understand webpages. "
          "You see a webpage as its accessibility tree: one line per element, indented by nesting, "
          "'*' marks interactive elements, and [left,top,right,bottom] is the element's box in "
          "screenshot pixels. Use only what the tree shows.")


def _page_header(page: Mapping) -> str:
    return (f"Platform: {page.get('platform')} ({page.get('screenshot_width')}x{page.get('screenshot_height')} px)\n"
            f"Title: {clean_text(page.get('title')) or '(none)'}\nURL: {page.get('final_url') or page.get('url') or ''}")


def request_meta(page: Mapping, task: str, target_node: Optional[int] = None, bbox: Optional[list] = None,
          max_samples: int = 1, **extra: Any) -> dict:
    return {"task": task, "page_id": page["id"], "platform": page["platform"], "target_node": target_node,
            "bbox": bbox, "max_samples": max_samples, **extra}


def _request(page: Mapping, task: str, target: Any, messages: tuple, sampling: Sampling) -> Request:
    """A chat request whose id and sampling seed derive from (page, task, target)."""
    request_id = stable_id("multiui", page["id"], task, target)
    seed = (sampling.seed + int(request_id, 16)) % (MAX_SEED + 1)
    return Request(request_id, messages, dataclasses.replace(sampling, seed=seed))


def start_task(page: Mapping, task: str) -> tuple[TaskOutput, bool]:
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
WORD = re.compile(r"\w+")


def example_words_missing(page: Mapping, tree: str) -> list[str]:
    """The example page's words that this page's title and tree do not hold (small, so it travels
    in the request's meta to the parser, which never sees the page)."""
    words = set(WORD.findall(f"{page.get('title') or ''} {tree}".casefold()))
    return sorted(EXAMPLE_WORDS - words)


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
    out, ok = start_task(page, "webpage_caption")
    tree = tree_text(page.get("nodes") or [], tree_chars) if ok else ""
    if ok and not tree:
        out.skip("empty accessibility tree")
    if not tree:
        return out
    messages = ({"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"{_page_header(page)}\nAccessibility tree:\n{tree}\n\n{CAPTION_ASK}"})
    out.requests.append((_request(page, "webpage_caption", None, messages, sampling),
                         request_meta(page, "webpage_caption")))
    return out


def qa_requests(page: Mapping, sampling: Sampling = Sampling(max_tokens=600), pairs: int = 4,
                tree_chars: int = 6000, rules: TaskRules = TaskRules()) -> TaskOutput:
    """One request per page asking for `pairs` Q/A pairs in the strict `Q: ...` / `A: ...` format."""
    out, ok = start_task(page, "webpage_qa")
    tree = tree_text(page.get("nodes") or [], tree_chars) if ok else ""
    if ok and not tree:
        out.skip("empty accessibility tree")
    if not tree:
        return out
    messages = ({"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"{_page_header(page)}\nAccessibility tree:\n{tree}\n\n{_qa_ask(pairs)}"})
    out.requests.append((_request(page, "webpage_qa", None, messages, sampling),
                         request_meta(page, "webpage_qa", max_samples=rules.max_per_task)))
    return out


def action_grounding_requests(page: Mapping, sampling: Sampling = Sampling(max_tokens=60),
                              rules: TaskRules = TaskRules(), context_chars: int = 1000) -> TaskOutput:
    """One request per chosen interactive element: write the instruction a user would give."""
    out, ok = start_task(page, "action_grounding")
    if not ok:
        return out
    index = PageIndex(page)
    chosen = choose_nodes(out, index, page, "action_grounding", rules.max_per_task, lambda n: n.get("interactive"),
                          lambda n: "not a named control" if role_of(n) not in GROUNDING_ROLES
                          else grounding_problem(n, index, page, rules))
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
                             request_meta(page, "action_grounding", node_id, norm_bbox(node), element=describe(node),
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
