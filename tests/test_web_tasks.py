"""The nine MultiUI task generators on a hand-built page (no browser, no Beam, no model)."""
from __future__ import annotations

import base64
import io
import re

import numpy as np
import pytest
from PIL import Image, ImageDraw

from schemas.multiui import PAGES, SAMPLES, TASKS
from core.rejected import Rejected
from transforms.llm.requests import Completion, Request
from transforms.web.tasks import draw, llm_parse, llm_tasks, rule_tasks, templates, vision_tasks
from transforms.web.tasks.elements import TaskRules, format_box, light_page, page_problem
from transforms.web.tasks.tree_text import tree_text

W, H = 400, 300
BOX_ANSWER = re.compile(r"^\[\d\.\d{3}, \d\.\d{3}, \d\.\d{3}, \d\.\d{3}\]$")
POOL = ["Apple varieties", "Contact", "Shipping and returns", "Careers at Shop", "Privacy policy",
        "  contact ", "Blog", "Press", "Gift cards", "About Us | Shop", "", "   "]


def _png() -> bytes:
    image = Image.new("RGB", (W, H), (245, 245, 245))
    pen = ImageDraw.Draw(image)
    pen.rectangle([0, 0, W - 1, 39], fill=(30, 60, 120))
    pen.rectangle([300, 100, 380, 130], fill=(20, 140, 60))
    pen.rectangle([250, 150, 390, 260], fill=(200, 180, 40))
    for y in range(50, 90, 10):
        pen.line([10, y, 290, y], fill=(40, 40, 40))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _node(node_id, parent, role, name, box, tag="div", interactive=False, href=None, src=None, alt=None, depth=None):
    return {"node_id": node_id, "parent": parent, "depth": depth if depth is not None else (0 if parent < 0 else 1),
            "role": role, "name": name, "tag": tag, "box": [float(v) for v in box],
            "box_norm": [box[0] / W, box[1] / H, box[2] / W, box[3] / H], "interactive": interactive,
            "href": href, "src": src, "alt": alt}


LONG = "Every order over fifty dollars ships free within the country and arrives in two to three days"


def make_page(page_id="page-1", screenshot=None, actions=None, nodes=None, **extra):
    nodes = nodes if nodes is not None else [
        _node(0, -1, "RootWebArea", "Shop Home", [0, 0, W, H], tag="html"),
        _node(1, 0, "generic", "", [0, 0, W, 40]),
        _node(2, 1, "heading", "Welcome to the Shop", [10, 5, 250, 35], tag="h1", depth=2),
        _node(3, 2, "StaticText", "Welcome to the Shop", [10, 5, 250, 35], depth=3),
        _node(4, 1, "link", "About us", [260, 10, 320, 30], tag="a", interactive=True, href="/about", depth=2),
        _node(5, 4, "StaticText", "About us", [260, 10, 320, 30], depth=3),
        _node(6, 0, "link", "Read more", [10, 100, 80, 115], tag="a", interactive=True, href="/apples"),
        _node(7, 0, "link", "Read more", [10, 200, 80, 215], tag="a", interactive=True, href="/pears"),
        _node(8, 0, "button", "Add to cart", [300, 100, 380, 130], tag="button", interactive=True),
        _node(9, 0, "StaticText", "Fresh apples from local farms every morning.", [10, 50, 290, 90], tag="p"),
        _node(10, 0, "heading", "Our products", [10, 140, 200, 160], tag="h2"),
        _node(11, 0, "image", "Basket of apples", [250, 150, 390, 260], tag="img", src="/basket.jpg",
              alt="Basket of apples"),
        _node(12, 0, "StaticText", "   ", [10, 170, 100, 180]),
        _node(13, 0, "link", "Close menu", [395, 5, 398, 8], tag="a", interactive=True, href="#"),
        _node(14, 0, "StaticText", LONG, [10, 220, 390, 240], tag="p"),
        _node(15, 0, "link", "Outside link", [350, 280, 420, 310], tag="a", interactive=True, href="/out"),
        _node(16, 0, "textbox", "Search products", [100, 260, 240, 285], tag="input", interactive=True),
        _node(17, 0, "heading", "", [10, 290, 100, 299], tag="h3"),
        _node(18, 0, "StaticText", "OK", [200, 50, 220, 60]),
        # the text children Chromium gives links, buttons and headings (OCR reads them, not names)
        _node(19, 6, "StaticText", "Read more", [10, 100, 80, 115], depth=2),
        _node(20, 7, "StaticText", "Read more", [10, 200, 80, 215], depth=2),
        _node(21, 8, "StaticText", "Add to cart", [300, 100, 380, 130], depth=2),
        _node(22, 10, "StaticText", "Our products", [10, 140, 200, 160], depth=2),
    ]
    page = {"id": page_id, "url": "https://shop.example/", "final_url": "https://shop.example/",
            "source": "local", "source_ref": "tests/shop.html", "platform": "desktop", "viewport_width": W,
            "viewport_height": H, "device_scale_factor": 1.0, "title": "Shop Home", "html": "<html></html>",
            "screenshot": screenshot if screenshot is not None else _png(), "screenshot_width": W,
            "screenshot_height": H, "nodes": nodes,
            "actions": actions if actions is not None else [
                {"node_id": 4, "target_url": "https://shop.example/about", "target_title": "About Us | Shop"},
                {"node_id": 6, "target_url": "https://shop.example/apples", "target_title": "Apple varieties"},
                {"node_id": 99, "target_url": "https://shop.example/x", "target_title": "Gone"}],
            "text_chars": 200, "stylesheets_loaded": 1, "stylesheets_missing": 0, "images_loaded": 1,
            "images_missing": 0, "kept": True, "reject_reason": None}
    page.update(extra)
    return page


def completion(text, finish_reason="stop", model="test-model"):
    return Completion(request_id="r", text=text, finish_reason=finish_reason, prompt_tokens=10,
                      completion_tokens=5, model=model, backend="fake")


def check_samples(samples, task):
    """Schema, LLaVA shape, and box rules every sample keeps."""
    assert samples, task
    table = SAMPLES.to_arrow(samples)
    assert table.num_rows == len(samples)
    for sample in samples:
        SAMPLES.check_keys(sample)
        assert sample["task"] == task
        turns = sample["conversations"]
        assert [t["from"] for t in turns] == ["human", "gpt"]
        assert turns[0]["value"].startswith("<image>\n") and turns[0]["value"].count("<image>") == 1
        assert turns[1]["value"].strip()
        assert 0 <= sample["template_id"] < len(templates.TEMPLATES[task])
        if sample["bbox"] is not None:
            assert all(isinstance(v, float) and 0.0 <= v <= 1.0 and round(v, 3) == v for v in sample["bbox"])
    assert len({s["id"] for s in samples}) == len(samples)


def node_bbox(page, node_id):
    node = next(n for n in page["nodes"] if n["node_id"] == node_id)
    return [round(v, 3) for v in node["box_norm"]]


def test_fixture_page_is_a_pages_row():
    PAGES.to_arrow([make_page()])


# -- templates --------------------------------------------------------------------------------

def test_templates_per_task_format_without_key_error():
    assert set(templates.TEMPLATES) == set(TASKS)
    for task, options in templates.TEMPLATES.items():
        assert len(options) >= 10, task
        assert len(set(options)) == len(options), task
        for template_id, template in enumerate(options):
            used = templates.placeholders(template)
            assert used <= templates.FIELDS[task], (task, template)
            assert templates.REQUIRED[task] <= used, (task, template)
            values = {name: f"<{name}>" for name in templates.FIELDS[task]}
            for derived in ("instruction_bare", "instruction_lower"):
                values.pop(derived, None)
            text = templates.render(task, template_id, **values)
            assert text.strip() and "{" not in text


def test_template_choice_is_seeded_and_varies_with_the_page():
    assert templates.choose("element_grounding", "p1", 4) == templates.choose("element_grounding", "p1", 4)
    chosen = {templates.choose("element_grounding", f"page-{i}", 4) for i in range(60)}
    assert len(chosen) >= 6


# -- rule tasks -------------------------------------------------------------------------------

def test_heading_ocr_asks_for_the_main_heading_of_the_page():
    """VisualWebBench's heading OCR: one page-level question, the highest-level heading in the first screen."""
    page = make_page()
    out = rule_tasks.heading_ocr(page)
    check_samples(out.samples, "heading_ocr")
    assert [s["target_node"] for s in out.samples] == [2]                 # the h1, not the h2
    first = out.samples[0]
    assert first["conversations"][1]["value"] == "Welcome to the Shop"
    assert first["bbox"] == node_bbox(page, 2)
    assert "[" not in first["conversations"][0]["value"]                  # no box in the question
    assert first["generator"] == "rule" and first["box_px"] == [10, 5, 250, 35]
    assert out.skipped["no visible text"] == 1 and out.skipped["not the main heading"] == 1  # empty h3; the h2
    below = make_page(viewport_height=100)             # the first screen ends above both headings' tops? no: h1 at 5
    assert [s["target_node"] for s in rule_tasks.heading_ocr(below).samples] == [2]
    none = make_page(nodes=[n for n in make_page()["nodes"] if n["node_id"] not in (2, 3)], viewport_height=120)
    out = rule_tasks.heading_ocr(none)
    assert out.samples == [] and out.skipped["no heading in the first screen"] == 1
    assert out.skipped["heading below the first screen"] == 1             # the h2 at y=140


def test_ocr_answers_are_the_visible_text_not_the_accessible_name():
    nodes = make_page()["nodes"]
    nodes[4] = dict(nodes[4], name="Learn who we are and what we do")          # aria-label on "About us"
    nodes[2] = dict(nodes[2], name="Welcome to the Shop, skip to content")     # sr-only text, dropped from the tree
    nodes[5] = dict(nodes[5], name="About us ")
    page = make_page(nodes=nodes)
    read = {s["target_node"]: s["conversations"][1]["value"]
            for s in rule_tasks.element_ocr(page, TaskRules(max_per_task=50)).samples}
    assert read[2] == "Welcome to the Shop" and 5 not in read                   # not the name; text once
    assert read[4] == "About us" and 5 not in read          # the link's text, not its aria-label; read once
    heading = rule_tasks.heading_ocr(page).samples[0]
    assert heading["conversations"][1]["value"] == "Welcome to the Shop"
    hidden = make_page(nodes=[n for n in nodes if n["node_id"] != 3])          # its only text was hidden
    assert 2 not in {s["target_node"] for s in rule_tasks.element_ocr(hidden, TaskRules(max_per_task=50)).samples}
    from transforms.web.tasks.elements import PageIndex
    split = [_node(0, -1, "RootWebArea", "x", [0, 0, W, H]), _node(1, 0, "paragraph", "Hello world", [0, 0, 200, 20]),
             _node(2, 1, "StaticText", "Hello wor", [0, 0, 90, 20]), _node(3, 1, "StaticText", "ld", [90, 0, 110, 20]),
             _node(4, 1, "StaticText", "again", [0, 20, 50, 40])]
    assert PageIndex(make_page(nodes=split)).visible_text(split[1]) == "Hello world again"


def test_element_grounding_answers_the_rounded_box_and_applies_quality_rules():
    page = make_page()
    out = rule_tasks.element_grounding(page, TaskRules(max_per_task=50))
    check_samples(out.samples, "element_grounding")
    targets = {s["target_node"]: s for s in out.samples}
    # 2 heading, 4 link, 8 button, 9 text, 10 heading, 11 image (by alt), 16 text box; not the static "OK"
    assert set(targets) == {2, 4, 8, 9, 10, 11, 16} and out.skipped["trivial text"] == 1
    for node_id, sample in targets.items():
        assert sample["bbox"] == node_bbox(page, node_id)
        answer = sample["conversations"][1]["value"]
        assert BOX_ANSWER.match(answer) and answer == format_box(sample["bbox"])
    assert 'button "Add to cart"' in targets[8]["conversations"][0]["value"]
    assert targets[4]["bbox"] == [0.65, 0.033, 0.8, 0.1]
    assert out.skipped["duplicate name on the page"] == 2  # both "Read more" links
    assert out.skipped["repeats an ancestor's name"] == 6  # the text inside headings, links and the button
    assert out.skipped["empty name"] == 2  # the whitespace text and the empty heading
    assert out.skipped["box under 4 px"] == 1
    assert out.skipped["box outside the screenshot"] == 1
    assert out.skipped["name too long for grounding"] == 1


def test_a_heading_that_repeats_the_page_title_is_still_a_target():
    nodes = make_page()["nodes"]
    nodes[0] = dict(nodes[0], name="Welcome to the Shop")  # document node named after the title
    page = make_page(nodes=nodes, title="Welcome to the Shop")
    grounded = {s["target_node"] for s in rule_tasks.element_grounding(page, TaskRules(max_per_task=50)).samples}
    read = {s["target_node"] for s in rule_tasks.element_ocr(page, TaskRules(max_per_task=50)).samples}
    assert 2 in grounded and 2 in read and 3 not in grounded | read


def test_max_per_task_caps_samples():
    page = make_page()
    out = rule_tasks.element_grounding(page, TaskRules(max_per_task=2))
    assert len(out.samples) == 2 and out.skipped["over max_per_task"] == 5
    assert len(rule_tasks.heading_ocr(page, TaskRules(max_per_task=8)).samples) == 1    # one per page


def _changed_and_ring(original, drawn, box, width=3):
    before = np.asarray(Image.open(io.BytesIO(original)).convert("RGB")).astype(int)
    after = np.asarray(Image.open(io.BytesIO(drawn)).convert("RGB")).astype(int)
    changed = (before != after).any(axis=2)
    l, t, r, b = (int(v) for v in box)
    # the frame: `width` px just outside the box, pushed inside where the box touches the border
    x0, y0, x1, y1 = max(0, l - width), max(0, t - width), min(W - 1, r - 1 + width), min(H - 1, b - 1 + width)
    ys, xs = np.mgrid[0:H, 0:W]
    outer = (xs >= x0) & (xs <= x1) & (ys >= y0) & (ys <= y1)
    inner = (xs >= x0 + width) & (xs <= x1 - width) & (ys >= y0 + width) & (ys <= y1 - width)
    return after, changed, outer & ~inner


def test_element_ocr_stores_the_box_and_readers_draw_the_red_frame():
    page = make_page()
    screenshot = bytes(page["screenshot"])
    out = rule_tasks.element_ocr(page, TaskRules(max_per_task=50))
    check_samples(out.samples, "element_ocr")
    assert page["screenshot"] == screenshot  # the page's screenshot is untouched
    by_node = {s["target_node"]: s for s in out.samples}
    # 2 heading, 4 link ("About us"), 6/7 "Read more" links, 8 button, 9 text, 10 heading, 14 long text
    assert set(by_node) == {2, 4, 6, 7, 8, 9, 10, 14}
    assert out.skipped["trivial text"] == 1  # "OK"
    for node_id, sample in by_node.items():
        node = page["nodes"][node_id]
        assert sample["conversations"][1]["value"] == node["name"]
        assert sample["bbox"] == node_bbox(page, node_id)
        assert sample["box_px"] == [int(round(v)) for v in node["box"]] and "image" not in sample
        drawn = draw.to_png(draw.sample_image(screenshot, sample))   # what `export` and `inspect` draw
        after, changed, ring = _changed_and_ring(screenshot, drawn, node["box"])
        assert (changed == ring).all(), node_id  # exactly the 3 px frame changed
        assert (after[ring] == [255, 0, 0]).all()  # and it is pure red
        assert drawn == draw.draw_box(screenshot, node["box"])       # the samples v1 copy, pixel for pixel


def test_element_ocr_never_decodes_the_screenshot():
    """Making the sample costs no PNG decode or encode: a broken PNG is the reader's bad_image."""
    out = rule_tasks.element_ocr(make_page(screenshot=b"not a png"))
    assert out.samples and not out.rejected
    with pytest.raises(ValueError):
        draw.sample_image(make_page()["screenshot"], dict(out.samples[0], box_px=None))


def test_action_prediction_offers_eight_distinct_options():
    page = make_page()
    out = rule_tasks.action_prediction(page, POOL)
    check_samples(out.samples, "action_prediction")
    assert out.skipped["action node not in the tree"] == 1
    truth = {4: "About Us | Shop", 6: "Apple varieties"}
    assert {s["target_node"] for s in out.samples} == set(truth)
    for sample in out.samples:
        question, answer = (t["value"] for t in sample["conversations"])
        options = re.findall(r"^([A-H])\. (.+)$", question, re.MULTILINE)
        assert [letter for letter, _ in options] == list("ABCDEFGH")
        titles = [title for _, title in options]
        assert len({t.casefold() for t in titles}) == 8
        letter = dict((title, l) for l, title in options)[truth[sample["target_node"]]]
        assert answer == f"{letter}. {truth[sample['target_node']]}"
        assert format_box(sample["bbox"]) in question
        assert sample["bbox"] == node_bbox(page, sample["target_node"])


def test_action_prediction_skips_without_seven_distractors():
    out = rule_tasks.action_prediction(make_page(), ["Contact", "contact", "Blog", "Apple varieties", "Press"])
    assert out.samples == []
    assert out.skipped["fewer than 7 distinct distractor titles"] == 2


def test_option_order_ignores_pool_order():
    page = make_page()
    one = rule_tasks.action_prediction(page, POOL).samples
    two = rule_tasks.action_prediction(page, list(reversed(POOL))).samples
    assert one == two


def test_rule_tasks_are_deterministic_and_vary_across_pages():
    first = rule_tasks.rule_samples(make_page(), POOL)
    again = rule_tasks.rule_samples(make_page(), POOL)
    for task in rule_tasks.RULE_TASKS:
        assert first[task].samples == again[task].samples, task
    used = set()
    for i in range(25):
        for sample in rule_tasks.element_grounding(make_page(f"page-{i}"), TaskRules(max_per_task=50)).samples:
            used.add(sample["template_id"])
    assert len(used) >= 8


def test_no_samples_from_dropped_or_screenshotless_pages():
    for page in (make_page(kept=False, screenshot=b""), make_page(screenshot=b"", screenshot_width=0,
                                                                  screenshot_height=0)):
        outs = list(rule_tasks.rule_samples(page, POOL).values())
        outs += list(llm_tasks.llm_requests(page).values())
        outs += list(vision_tasks.embedded_image_tasks(page, vision=False).values())
        for out in outs:
            assert not out.samples and not out.requests and not out.rejected and sum(out.skipped.values()) == 1


def test_the_light_page_makes_the_same_rule_samples_and_llm_requests_without_the_bytes():
    """What the graph's joins carry (light_page): no HTML or screenshot bytes, the same outputs, and
    a screenshotless page still makes nothing."""
    page = make_page(html="<html>" + "x" * 10_000 + "</html>")
    light = light_page(page)
    assert "screenshot" not in light and "html" not in light and light["screenshot_bytes"] == len(page["screenshot"]) > 0
    full, slim = rule_tasks.rule_samples(page, POOL), rule_tasks.rule_samples(light, POOL)
    for task in rule_tasks.RULE_TASKS:
        assert slim[task].samples == full[task].samples and slim[task].skipped == full[task].skipped, task
    assert sum(len(out.samples) for out in full.values()) > 0
    for task, out in llm_tasks.llm_requests(light).items():
        assert out.requests == llm_tasks.llm_requests(page)[task].requests and out.requests, task
    none = light_page(make_page(screenshot=b""))
    assert none["screenshot_bytes"] == 0 and page_problem(none) == "page has no screenshot"
    assert not any(out.samples for out in rule_tasks.rule_samples(none, POOL).values())


# -- tree text --------------------------------------------------------------------------------

def test_tree_text_is_compact_marked_and_bounded():
    page = make_page()
    text = tree_text(page["nodes"])
    assert text == tree_text(page["nodes"])
    lines = text.splitlines()
    assert lines[0] == 'RootWebArea "Shop Home" [0,0,400,300]'
    assert ' heading "Welcome to the Shop" [10,5,250,35]' in lines  # generic parent left out: depth 1
    assert ' *link "About us" [260,10,320,30]' in lines
    assert sum('"About us"' in line for line in lines) == 1  # the repeated StaticText is left out
    assert ' image "Basket of apples" [250,150,390,260]' in lines
    short = tree_text(page["nodes"], max_chars=150)
    assert len(short) <= 150 and short.endswith("more nodes)")
    focused = tree_text(page["nodes"], max_chars=150, focus=16)
    assert '*textbox "Search products"' in focused and len(focused) <= 150


# -- LLM tasks --------------------------------------------------------------------------------

def test_caption_request_and_parser():
    page = make_page()
    out = llm_tasks.caption_requests(page)
    assert out.samples == [] and len(out.requests) == 1
    request, meta = out.requests[0]
    assert isinstance(request, Request) and request.is_chat
    assert tree_text(page["nodes"]) in request.prompt[-1]["content"]
    assert request == llm_tasks.caption_requests(page).requests[0][0]
    good = completion("Caption: This is the home page of an online shop selling fresh apples. A dark banner "
                      "holds the title and an About us link. Below, products are listed with buttons.")
    samples = llm_parse.parse_completion(meta, good)
    check_samples(samples, "webpage_caption")
    assert samples[0]["generator"] == "llm:test-model" and samples[0]["target_node"] is None
    assert samples[0]["conversations"][1]["value"].startswith("This is the home page")
    assert samples[0]["bbox"] is None and samples[0]["box_px"] is None
    for bad, reason in ((completion("   "), "empty model output"),
                        (completion("I'm sorry, I can't help with that."), "model refused"),
                        (completion("asdf qwer"), "caption too short"),
                        (completion("This page shows a shop with many apples and a banner at the top of the "
                                    "page and a", "length"), "caption cut off at max_tokens")):
        result = llm_parse.parse_completion(meta, bad)
        assert isinstance(result, Rejected) and result.reason == reason
    cut = completion(good.text + " It also has a search", "length")
    assert llm_parse.parse_completion(meta, cut)[0]["conversations"][1]["value"].endswith("with buttons.")


def test_qa_parser():
    page = make_page()
    out = llm_tasks.qa_requests(page, pairs=4)
    request, meta = out.requests[0]
    assert "Q: <question>" in request.prompt[-1]["content"]
    text = ("Here are the pairs:\nQ: What does the shop sell?\nA: Fresh apples from local farms.\n\n"
            "Q1: Where can you learn about the shop?\nA1: Through the About us link\nin the banner.\n"
            "Q: A question without an answer\n"
            "Q: What does the shop sell?\nA: A duplicate question.\n")
    samples = llm_parse.parse_completion(meta, completion(text))
    check_samples(samples, "webpage_qa")
    assert len(samples) == 2
    assert "What does the shop sell?" in samples[0]["conversations"][0]["value"]
    assert samples[0]["conversations"][1]["value"] == "Fresh apples from local farms."
    assert samples[1]["conversations"][1]["value"] == "Through the About us link\nin the banner."
    for bad in ("", "lorem ipsum dolor sit amet", "Q: only a question", "A: only an answer"):
        result = llm_parse.parse_completion(meta, completion(bad))
        assert isinstance(result, Rejected)
    assert llm_parse.parse_completion(meta, completion("nonsense")).reason == "no Q/A pair in model output"
    # a completion cut at max_tokens loses its last (maybe partial) pair
    cut = llm_parse.parse_completion(meta, completion("Q: One?\nA: Yes.\nQ: Two?\nA: Partial", "length"))
    assert [s["conversations"][1]["value"] for s in cut] == ["Yes."]
    capped = dict(meta, max_samples=1)
    assert len(llm_parse.parse_completion(capped, completion(text))) == 1


def test_action_grounding_requests_and_parser():
    page = make_page()
    out = llm_tasks.action_grounding_requests(page, rules=TaskRules(max_per_task=50))
    metas = {meta["target_node"]: (request, meta) for request, meta in out.requests}
    assert set(metas) == {4, 8, 16}  # the duplicate "Read more" links, the tiny and the outside link are skipped
    assert out.skipped["duplicate name on the page"] == 2
    assert len({request.id for request, _ in out.requests}) == 3
    request, meta = metas[8]
    assert 'button "Add to cart" [300,100,380,130]' in request.prompt[-1]["content"]
    samples = llm_parse.parse_completion(meta, completion("Instruction: Put the apples in my shopping cart."))
    check_samples(samples, "action_grounding")
    sample = samples[0]
    assert "Put the apples in my shopping cart" in sample["conversations"][0]["value"]
    assert sample["conversations"][1]["value"] == format_box(node_bbox(page, 8))
    assert sample["bbox"] == node_bbox(page, 8) and sample["target_node"] == 8
    assert sample["generator"] == "llm:test-model"
    for bad in ("", "  \n ", "Instruction: click [300, 100]", "Instruction: x", "As an AI, I cannot do that."):
        assert isinstance(llm_parse.parse_completion(meta, completion(bad)), Rejected), bad


def test_llm_requests_are_deterministic():
    one = llm_tasks.llm_requests(make_page())
    two = llm_tasks.llm_requests(make_page())
    for task in llm_tasks.LLM_TASKS:
        assert one[task].requests == two[task].requests
    other = llm_tasks.llm_requests(make_page("page-2"))
    assert one["webpage_caption"].requests[0][0].id != other["webpage_caption"].requests[0][0].id


# -- vision tasks -----------------------------------------------------------------------------

def test_vision_tasks_never_make_samples_without_a_vision_backend():
    outputs = vision_tasks.embedded_image_tasks(make_page(), vision=False)
    assert set(outputs) == {"embedded_image_caption", "embedded_image_qa"}
    for task, out in outputs.items():
        assert out.samples == [] and out.requests == []
        assert out.rejected == [] and out.skipped == {vision_tasks.NEEDS_VISION: 1}
    no_images = make_page(nodes=[n for n in make_page()["nodes"] if n["role"] != "image"])
    for out in vision_tasks.embedded_image_tasks(no_images).values():
        assert out.rejected == [] and out.skipped["no embedded images"] == 1


def test_vision_requests_carry_the_cropped_image():
    page = make_page()
    out = vision_tasks.vision_requests(page, "embedded_image_caption")
    assert out.samples == [] and len(out.requests) == 1
    request, meta = out.requests[0]
    assert request.has_images
    parts = request.prompt[0]["content"]
    assert parts[0]["type"] == "text" and "Basket of apples" in parts[0]["text"]
    url = parts[1]["image_url"]["url"]
    assert parts[1]["type"] == "image_url" and url.startswith("data:image/png;base64,")
    crop = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert crop.size == (140, 110)
    samples = llm_parse.parse_completion(meta, completion("A wicker basket full of red apples."))
    check_samples(samples, "embedded_image_caption")
    assert samples[0]["bbox"] == node_bbox(page, 11) and samples[0]["target_node"] == 11
    qa_request, qa_meta = vision_tasks.vision_requests(page, "embedded_image_qa").requests[0]
    qa = llm_parse.parse_completion(qa_meta, completion("Q: What fruit is shown?\nA: Apples."))
    check_samples(qa, "embedded_image_qa")
    assert format_box(qa[0]["bbox"]) in qa[0]["conversations"][0]["value"]


# -- drawing ----------------------------------------------------------------------------------

def test_draw_box_and_sample_card():
    png = _png()
    drawn = draw.draw_box(png, [0, 0, 50, 20])  # at the image corner: the frame is clipped there
    after, changed, ring = _changed_and_ring(png, drawn, [0, 0, 50, 20])
    assert (changed == ring).all() and (after[ring] == [255, 0, 0]).all()
    with pytest.raises(ValueError):
        draw.draw_box(png, [500, 500, 600, 600])
    sample = rule_tasks.element_grounding(make_page()).samples[0]
    card = draw.render_sample_card(png, sample["bbox"], sample["conversations"][0]["value"],
                                   sample["conversations"][1]["value"])
    image = Image.open(io.BytesIO(card))
    assert image.width == 800 and image.height > 600
    tall = Image.new("RGB", (400, 3000), "white")
    buffer = io.BytesIO()
    tall.save(buffer, format="PNG")
    card = draw.render_sample_card(buffer.getvalue(), None, "<image>\nDescribe " + "word " * 300, "answer")
    assert Image.open(io.BytesIO(card)).height <= 1600 + 600


def test_grounding_skips_short_text_fragments_but_not_short_controls():
    page = make_page()
    nodes = list(page["nodes"])
    base = dict(nodes[-1])
    fragment = dict(base, node_id=900, parent=0, depth=1, role="StaticText", name="and", interactive=False,
                    box=[100.0, 100.0, 130.0, 118.0], box_norm=[0.1, 0.1, 0.13, 0.118], href=None, src=None, alt=None)
    button = dict(fragment, node_id=901, role="button", name="Go", interactive=True,
                  box=[200.0, 100.0, 240.0, 130.0], box_norm=[0.2, 0.1, 0.24, 0.13])
    out = rule_tasks.element_grounding(dict(page, nodes=nodes + [fragment, button]), TaskRules(max_per_task=100))
    targets = {s["target_node"] for s in out.samples}
    assert 900 not in targets and 901 in targets and out.skipped["trivial text"] >= 1
