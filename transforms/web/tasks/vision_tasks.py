"""The MultiUI tasks about a page's embedded images, for a model that sees them.

Without one, `embedded_image_tasks(page, vision=False)` counts the images left undone as a skip
("needs a vision-capable backend"); it never makes a sample from alt text or any other stand-in.
With a vision backend, `vision_requests` builds chat Requests whose user content holds a text
part and an `image_url` part with a data: URL of the cropped image (PNG, base64), which the
OpenAI backend sends as they are. Their completions parse with llm_parse.parse_completion.
"""
from __future__ import annotations

import base64
import dataclasses
import io
from typing import Mapping


from transforms.io.ids import stable_id
from core.rejected import Rejected
from transforms.llm.requests import MAX_SEED, Request, Sampling
from transforms.web.tasks.elements import (IMAGE_ROLES, TaskOutput, TaskRules, box_problem, clean_text, norm_bbox,
                                           pick, reading_order, role_of)
from transforms.web.tasks.llm_tasks import VISION_TASKS, request_meta, start_task


def embedded_images(page: Mapping, rules: TaskRules = TaskRules()) -> list:
    """Image nodes big enough to describe, inside the screenshot, in reading order."""
    nodes = [n for n in page.get("nodes") or []
             if (role_of(n) in IMAGE_ROLES or str(n.get("tag") or "").lower() == "img")
             and box_problem(n, page, rules.min_image_px) is None]
    return reading_order(nodes)


def crop_png(png: bytes, box_px, max_side: int = 768) -> bytes:
    """The box cut out of the screenshot as PNG, scaled down so its longer side is <= max_side."""
    from PIL import Image   # pillow: the web extra
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
    out, ok = start_task(page, task)
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
                             request_meta(page, task, node_id, norm_bbox(node),
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
        out, ok = start_task(page, task)
        count = len(embedded_images(page, rules)) if ok else 0
        if ok and not count:
            out.skip("no embedded images")
        elif count:
            out.skip(NEEDS_VISION, count)
        outputs[task] = out
    return outputs
