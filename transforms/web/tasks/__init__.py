"""The nine MultiUI task generators (docs/papers/multiui.md) as plain functions: no Beam, no browser.

Input: a `pages` row as a dict (schemas/multiui.py). Output: `samples` rows, through a
TaskOutput that also counts what was skipped and why and holds bad input as Rejected.

  rule_tasks.py   heading_ocr, element_ocr, element_grounding, action_prediction
  llm_tasks.py    webpage_caption, webpage_qa, action_grounding: the requests
  vision_tasks.py embedded_image_caption / _qa (vision backend only; counted as skipped otherwise)
  llm_parse.py    samples (or the reason for none) out of the model's completions, text and vision
  templates.py    instruction paraphrases per task, chosen by a seeded draw
  tree_text.py    the accessibility tree as compact text for prompts
  draw.py         the red box of element OCR and sample cards for `shardsmith inspect`
  elements.py     quality rules (TaskRules), element choice, the sample row
"""
from transforms.web.tasks.elements import TaskOutput, TaskRules, make_sample
from transforms.web.tasks.llm_parse import parse_completion
from transforms.web.tasks.llm_tasks import llm_requests
from transforms.web.tasks.vision_tasks import embedded_image_tasks, vision_requests
from transforms.web.tasks.rule_tasks import rule_samples

__all__ = ["TaskOutput", "TaskRules", "make_sample", "rule_samples", "llm_requests", "parse_completion",
           "embedded_image_tasks", "vision_requests"]
