"""The LLM-task parsers on real completions of the default model (SmolLM2-135M-Instruct on the
bundled site, recorded in tests/data/multiui_llm_outputs.json) and on hand-written near-misses of
the asked-for formats. A near-miss is read; prose, loops and chit-chat are rejected with a reason."""
from __future__ import annotations

import json
import os

import pytest

from core.rejected import Rejected
from transforms.llm.requests import Completion
from transforms.web.tasks import llm_parse, llm_tasks

FIXTURES = os.path.join(os.path.dirname(__file__), "data", "multiui_llm_outputs.json")
with open(FIXTURES, encoding="utf-8") as fh:
    RECORDED = json.load(fh)


def _meta(task: str) -> dict:
    grounding = task == "action_grounding"
    return {"task": task, "page_id": "page-1", "platform": "desktop", "target_node": 7 if grounding else None,
            "bbox": [0.1, 0.2, 0.3, 0.4] if grounding else None, "max_samples": 8}


def _parse(task: str, text: str, finish: str = "stop"):
    return llm_parse.parse_completion(_meta(task), Completion("r1", text, finish, 10, 10, "test-model", "test"))


def _turns(samples: list) -> tuple[list, list]:
    questions = [s["conversations"][0]["value"] for s in samples]
    return questions, [s["conversations"][1]["value"] for s in samples]


@pytest.mark.parametrize("case", RECORDED, ids=[f"{c['task']}-{i}" for i, c in enumerate(RECORDED)])
def test_recorded_completions_of_the_default_model(case):
    meta = dict(_meta(case["task"]), example_words=case.get("example_words", []))
    result = llm_parse.parse_completion(meta, Completion("r1", case["text"], case["finish_reason"], 10, 10, "m", "t"))
    if not case["usable"]:
        assert isinstance(result, Rejected) and result.reason == case["reason"], case["note"]
        assert result.excerpt["text"] == case["text"][:300]          # the dead letter shows the output
        return
    assert isinstance(result, list) and result, case["note"]
    questions, answers = _turns(result)
    for wanted in case.get("questions", []):
        assert any(wanted in q for q in questions), (wanted, questions)
    assert len(questions) == len(set(questions))
    if case["note"].startswith("a second 'A:'"):
        assert answers and all(a.count("Cedar Field Lantern is") == 1 for a in answers)
    if "answers" in case:
        assert answers == case["answers"]
    if "instruction" in case:
        assert case["instruction"] in questions[0] and "[562" not in questions[0]


@pytest.mark.parametrize("text, pairs", [
    ("**Q1:** What does the shop sell?\n**A1:** Outdoor gear.\n**Q2:** Where is it?\n**A2:** On Quay Street.",
     [("What does the shop sell?", "Outdoor gear."), ("Where is it?", "On Quay Street.")]),
    ("Q: What does the shop sell? A: Outdoor gear.\nQ: Where is it? A: On Quay Street.",
     [("What does the shop sell?", "Outdoor gear."), ("Where is it?", "On Quay Street.")]),
    ("1. What does the shop sell?\n   Outdoor gear.\n2. Where is it?\n   On Quay Street.",
     [("What does the shop sell?", "Outdoor gear."), ("Where is it?", "On Quay Street.")]),
    ("Q What does the shop sell?\nA: Outdoor gear.", [("What does the shop sell?", "Outdoor gear.")]),
    ("Question 1 - What does the shop sell?\nAnswer 1 - Outdoor gear.", [("What does the shop sell?", "Outdoor gear.")]),
    ("- Q: What does the shop sell?\n- A: Outdoor gear.\n\nI hope these help!", [("What does the shop sell?", "Outdoor gear.")]),
    ("Q: What does the shop sell?\nAnswer:\nOutdoor gear\nand maps.", [("What does the shop sell?", "Outdoor gear\nand maps.")]),
    ("1. What does the shop sell? Outdoor gear.", [("What does the shop sell?", "Outdoor gear.")]),
])
def test_qa_near_misses_are_read(text, pairs):
    assert llm_parse.qa_pairs(text) == pairs


def test_qa_drops_unanswered_questions():
    text = "Q: Where is the shop?\nA: On Quay Street.\n1. Why?\n2. How?"
    assert _turns(_parse("webpage_qa", text))[1] == ["On Quay Street."]


@pytest.mark.parametrize("text, caption", [
    ("## Caption\n**Caption:** The page sells outdoor gear. It has a top bar with links, a large banner "
     "and a grid of products with prices.",
     "The page sells outdoor gear. It has a top bar with links, a large banner and a grid of products with prices."),
    ("Description: The page of an outdoor shop:\n- a top bar with links to the shop and the journal\n"
     "- a banner with a photo of the coast [0,80,1280,400]\n- a grid of tents with prices",
     "The page of an outdoor shop: a top bar with links to the shop and the journal. a banner with a photo of the "
     "coast. a grid of tents with prices."),
])
def test_caption_near_misses_become_prose(text, caption):
    assert _turns(_parse("webpage_caption", text))[1] == [caption]


def test_a_looping_caption_is_rejected():
    loop = "The page has a variety of services, " + "a variety of services, " * 12 + "and more."
    assert _parse("webpage_caption", loop).reason == "caption repeats itself (a generation loop)"


@pytest.mark.parametrize("text, instruction", [
    ("Instruction: Open the repairs page.", "Open the repairs page."),
    ("**Instruction:** \"Book a tent repair\"", "Book a tent repair"),
    ("Sure! Here is one:\nInstruction:\nShow me the store opening hours.", "Show me the store opening hours."),
    ("Instruction 1: Search for waterproof jackets [120,40,400,72]", "Search for waterproof jackets"),
    ("Open the size guide for boots.", "Open the size guide for boots."),
])
def test_instruction_near_misses_are_read(text, instruction):
    questions, answers = _turns(_parse("action_grounding", text))
    assert instruction in questions[0] and answers == ["[0.100, 0.200, 0.300, 0.400]"]


@pytest.mark.parametrize("text, reason", [
    ("This page lists tents.\nYou can click the link to see them.", "no Instruction: line in model output"),
    ("Here is an instruction for the link.", "not an instruction (describes the page or chats)"),
    ("Instruction: Open", "instruction too short"),
])
def test_prose_is_not_an_instruction(text, reason):
    assert _parse("action_grounding", text).reason == reason


def test_caption_and_qa_requests_show_no_example():
    page = {"id": "p1", "platform": "desktop", "kept": True, "screenshot": b"png", "screenshot_width": 100,
            "screenshot_height": 100, "title": "Shop", "url": "http://x/", "nodes": [
                {"node_id": 0, "parent": -1, "depth": 0, "role": "RootWebArea", "name": "Shop", "box": [0, 0, 100, 100]},
                {"node_id": 1, "parent": 0, "depth": 1, "role": "heading", "name": "Tents and mats", "box": [5, 5, 90, 20]}]}
    for out in (llm_tasks.caption_requests(page), llm_tasks.qa_requests(page)):
        request, _ = out.requests[0]           # shown one, the default model copied it back
        assert [m["role"] for m in request.prompt] == ["system", "user"]
        assert "Tents and mats" in request.prompt[1]["content"] and "Acme" not in request.prompt[1]["content"]


def test_output_that_copies_the_example_page_is_rejected():
    meta = dict(_meta("webpage_caption"), example_words=["bakery", "sourdough"])
    copied = ("The webpage is the home page of Cedar Field Bakery, a bakery that sells fresh bread. A top bar has "
              "links to the menu.")            # recorded when the caption prompt showed an example
    result = llm_parse.parse_completion(meta, Completion("r1", copied, "stop", 1, 1, "m", "b"))
    assert result.reason == llm_parse.COPIED
    own_page = dict(meta, example_words=[])     # a bakery's own page may say bakery
    assert isinstance(llm_parse.parse_completion(own_page, Completion("r1", copied, "stop", 1, 1, "m", "b")), list)
    qa = dict(_meta("webpage_qa"), example_words=["cake"])
    text = "Q: How can a customer order a cake?\nA: Customers can order a cake.\nQ: Where is it?\nA: On Quay Street."
    samples = llm_parse.parse_completion(qa, Completion("r1", text, "stop", 1, 1, "m", "b"))
    assert _turns(samples)[1] == ["On Quay Street."]


def test_action_grounding_shows_an_example_and_stops_at_a_blank_line():
    from tests.test_web_tasks import make_page
    request, meta = llm_tasks.action_grounding_requests(make_page()).requests[0]
    assert [m["role"] for m in request.prompt] == ["system", "user", "assistant", "user"]
    assert request.prompt[2]["content"] == "Instruction: " + llm_tasks.EXAMPLE_INSTRUCTION
    assert request.sampling.stop == ("\n\n",) and "acme" in meta["example_words"]
