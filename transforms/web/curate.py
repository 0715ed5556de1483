"""Curation applied to page rows: the rules' verdict (transforms/web/curation.py), then the optional
LLM judge's. A dropped page keeps its row, with the reason and without the screenshot, so the
filters can be audited from the shards.
"""
from __future__ import annotations

from typing import Optional

from core.rejected import Skipped
from transforms.llm.ask import asking, unasked
from transforms.llm.requests import Completion, Sampling
from transforms.web import curation
from transforms.web.tasks.tree_text import tree_text


def curate(page: dict, min_text_chars: int, rules: Optional[curation.Rules] = None) -> dict:
    """The rules' verdict on a page; a dropped page keeps its row without the screenshot."""
    reason = curation.rule_reason(page, min_text_chars, rules=rules)
    return drop(page, reason) if reason else page


def drop(page: dict, reason: str) -> dict:
    return dict(page, kept=False, reject_reason=reason, screenshot=None, screenshot_width=0, screenshot_height=0)


def judge_plan(page: dict, sampling: Sampling):
    """Plan stage of the judge (transforms/llm/ask.py events): a kept page asks for a verdict; a
    page the rules dropped passes without asking."""
    if page["kept"]:
        yield from asking(curation.judge_request(page, tree_text(page["nodes"], max_chars=3000), sampling), page)
    else:
        yield unasked(page)


def judged(page: dict, verdict: Optional[Completion]) -> list:
    """The page after the judge's verdict. No verdict (not asked, or the request is a dead letter of
    the judge's generation) keeps the page; so does an answer that is no label, counted as skipped."""
    if not page["kept"] or verdict is None:
        return [page]
    reason, problem = curation.judge_reason(verdict)
    out = [drop(page, reason) if reason else page]
    if problem:
        out.append(Skipped("judge: unreadable verdict (page kept)"))
    return out
