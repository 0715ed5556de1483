"""Instruction templates: many paraphrases per task, one chosen per sample by a seeded draw.

MultiUI phrases each task through many paraphrased instructions (the paper: about 200 per
task) so that a model learns the task rather than one sentence. These are ours, a dozen per
task. The choice is seeded by (page id, task, target), so a rerun picks the same template and
different pages spread over all of them; `template_id` is the index in the task's tuple, so
templates are only ever appended, never reordered, or old ids would change meaning.

Placeholders per task are listed in FIELDS (action grounding's instruction also comes as
`instruction_bare`, without end punctuation, and `instruction_lower`, as the end of a
question; render() derives both); REQUIRED names those every template of a task must use (an embedded-image question without the
image's box would be ambiguous). The heading OCR templates were replaced with samples v2, when
the task became VisualWebBench's page-level question.
"""
from __future__ import annotations

import string
from typing import Any

from transforms.web.tasks.elements import rng_for

TEMPLATES: dict[str, tuple[str, ...]] = {
    "webpage_caption": (
        "Describe this webpage in detail.",
        "Write a detailed caption for this webpage screenshot.",
        "What does this webpage show? Give a thorough description.",
        "Summarize the content and layout of the webpage in the screenshot.",
        "Provide a comprehensive description of this web page.",
        "Explain what this website page is about and what it contains.",
        "Give a caption describing the purpose and main content of this webpage.",
        "Describe the page you see, including its main sections.",
        "Can you describe this screenshot of a website?",
        "Tell me what is on this webpage.",
        "Write a paragraph describing this webpage for someone who cannot see it.",
        "Generate a detailed description of the web page shown.",
    ),
    "embedded_image_caption": (
        "Describe the image located at {box} on this webpage.",
        "Write a caption for the picture inside the region {box}.",
        "What does the image at {box} show?",
        "Give a short description of the embedded image at {box}.",
        "Caption the image found in the area {box} of the page.",
        "There is an image at {box}. Describe it.",
        "Describe the content of the picture bounded by {box}.",
        "What is depicted in the image at position {box}?",
        "Provide a caption for the webpage image at {box}.",
        "Look at the image in {box} and describe what you see.",
        "Explain what the image at coordinates {box} contains.",
        "Write a one-sentence description of the image at {box}.",
    ),
    "webpage_qa": (
        "{question}",
        "Answer the question based on the webpage: {question}",
        "Using the information on this webpage, answer: {question}",
        "Question about the page: {question}",
        "Look at the webpage and answer the following question. {question}",
        "According to this webpage, {question}",
        "{question} Answer using the screenshot.",
        "Read the webpage and respond: {question}",
        "Based on the screenshot of the website, {question}",
        "Here is a question about the page shown. {question}",
        "Refer to the webpage to answer this: {question}",
        "From the content of this web page: {question}",
    ),
    "embedded_image_qa": (
        "Look at the image at {box}. {question}",
        "About the picture located at {box}: {question}",
        "Regarding the image in the region {box}, {question}",
        "Answer about the embedded image at {box}: {question}",
        "The webpage has an image at {box}. {question}",
        "Focus on the image at {box} and answer: {question}",
        "Consider the picture bounded by {box}. {question}",
        "{question} (Refer to the image at {box}.)",
        "Based on the image at position {box}, {question}",
        "Examine the image found at {box}. {question}",
        "Question about the image at {box}: {question}",
        "Using the image in the area {box}, answer the question. {question}",
    ),
    "action_prediction": (
        "Which page would clicking {element} at {box} lead to?",
        "If you click {element} located at {box}, which page opens?",
        "What is the title of the page you reach by clicking {element} at {box}?",
        "Predict the page that clicking {element} ({box}) would take you to.",
        "After clicking {element} in the region {box}, where would you end up?",
        "Clicking {element} at {box} opens a new page. Which one?",
        "Where does {element} at {box} lead when clicked?",
        "Suppose you click {element} at {box}. What page will load?",
        "Which of these pages follows a click on {element} ({box})?",
        "Choose the page title you would see after clicking {element} at {box}.",
        "What page is linked from {element} at {box}?",
        "Guess the destination of {element} located at {box}.",
    ),
    "action_grounding": (
        "{instruction}\nWhich element should be clicked? Answer with its bounding box.",
        "Instruction: {instruction}\nGive the bounding box of the element to interact with.",
        "To complete the task \"{instruction_bare}\", where should I click? Output a bounding box.",
        "Find the element needed for: {instruction}",
        "I want to do this: {instruction} Locate the element to use.",
        "Task: {instruction}\nReturn the bounding box [left, top, right, bottom] of the target element.",
        "Which element on the page lets me {instruction_lower}",
        "Ground this instruction on the webpage: {instruction}",
        "Where would you act on the page to carry out \"{instruction_bare}\"?",
        "Point to the element for the following instruction. {instruction}",
        "{instruction} Give the position of the element as a normalised box.",
        "Show me where to interact to accomplish: {instruction}",
    ),
    "element_grounding": (
        "Where is {element} on this webpage?",
        "Locate {element} and give its bounding box.",
        "Find {element} in the screenshot.",
        "What is the bounding box of {element}?",
        "Give the position of {element} as [left, top, right, bottom].",
        "Point out {element} on the page.",
        "Which region of the page contains {element}?",
        "Output the coordinates of {element}.",
        "In the screenshot, where can {element} be found?",
        "Ground {element} on this webpage.",
        "Return the normalised box around {element}.",
        "Show me where {element} is located.",
    ),
    # page-level since samples v2 (VisualWebBench's heading OCR: "the main text within the
    # screenshot, which can be regarded as the heading of the webpage"); v1 asked about a box
    "heading_ocr": (
        "What is the main heading of this webpage?",
        "Read the main heading of the page in the screenshot.",
        "What does the page's heading say?",
        "Transcribe the heading of this webpage.",
        "What is the main text that serves as the heading of this page?",
        "Which words make up the title heading shown on this webpage?",
        "OCR the main heading of the web page.",
        "Tell me the heading text of the page shown.",
        "What title text appears as the page's main heading?",
        "Give the exact wording of this webpage's main heading.",
        "Read out the heading at the top of this page.",
        "What is written in the main heading of the screenshot?",
    ),
    "element_ocr": (
        "What text is inside the red box?",
        "Read the text highlighted by the red rectangle.",
        "Transcribe the text within the red bounding box.",
        "What does the element marked in red say?",
        "Extract the text enclosed by the red box.",
        "OCR the content inside the red rectangle.",
        "Please read the text surrounded by the red frame.",
        "Which words appear in the red-outlined element?",
        "Give the exact text of the element in the red box.",
        "What is written in the region marked with a red box?",
        "Tell me the text that the red rectangle highlights.",
        "Copy the text inside the red box exactly.",
    ),
}

FIELDS: dict[str, frozenset] = {
    "webpage_caption": frozenset(),
    "embedded_image_caption": frozenset({"box"}),
    "webpage_qa": frozenset({"question"}),
    "embedded_image_qa": frozenset({"box", "question"}),
    "action_prediction": frozenset({"element", "box"}),
    "action_grounding": frozenset({"instruction", "instruction_bare", "instruction_lower"}),
    "element_grounding": frozenset({"element"}),
    "heading_ocr": frozenset(),
    "element_ocr": frozenset(),
}

REQUIRED: dict[str, frozenset] = {
    "webpage_caption": frozenset(),
    "embedded_image_caption": frozenset({"box"}),
    "webpage_qa": frozenset({"question"}),
    "embedded_image_qa": frozenset({"box", "question"}),
    "action_prediction": frozenset({"element", "box"}),
    "action_grounding": frozenset(),  # either form of the instruction
    "element_grounding": frozenset({"element"}),
    "heading_ocr": frozenset(),
    "element_ocr": frozenset(),
}


def placeholders(template: str) -> set:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def choose(task: str, page_id: str, target: Any) -> int:
    """The template index for (page, task, target): a draw from a Random seeded by their stable id."""
    return rng_for(page_id, task, target).randrange(len(TEMPLATES[task]))


def render(task: str, template_id: int, **fields: str) -> str:
    """The instruction text; fields a template does not use are ignored, missing ones raise KeyError."""
    if "instruction" in fields:  # derived forms: ends with punctuation / without it / lower-cased question
        bare = fields["instruction"].strip().rstrip(".!?;:").rstrip()
        fields["instruction"] = fields["instruction"].strip() if bare != fields["instruction"].strip() else bare + "."
        fields.setdefault("instruction_bare", bare)
        fields.setdefault("instruction_lower", bare[:1].lower() + bare[1:] + "?")
    return TEMPLATES[task][template_id].format(**fields)


def instruction(task: str, page_id: str, target: Any, **fields: str) -> tuple[int, str]:
    """(template_id, rendered instruction) in one call."""
    template_id = choose(task, page_id, target)
    return template_id, render(task, template_id, **fields)
