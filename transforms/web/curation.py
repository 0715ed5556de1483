"""Which rendered pages become training data: rule filters, then an optional LLM judge.

MultiUI had an LLM read each accessibility tree and drop adult, gambling, violent,
discriminatory and error pages. The rules below catch the obvious cases for free
(so the judge, when configured, sees fewer pages); a dropped page keeps its row
in `pages` with the reason, so the filters can be audited from the shards.
"""
from __future__ import annotations

import re
from typing import Optional

from transforms.llm.requests import Completion, Request, Sampling

ERROR_TITLES = re.compile(
    r"^\s*(\d{3}\b|error\b|not found|page not found|access denied|forbidden|service unavailable|"
    r"bad gateway|internal server error|site can.t be reached|this page isn.t working|"
    r"just a moment|attention required|are you a robot)", re.I)
PARKED = re.compile(r"\b(this domain (is|may be) for sale|buy this domain|domain is parked|parked free|"
                    r"parkingcrew|sedoparking|hugedomains)\b", re.I)

# Deliberately short, whole-word lists: they flag pages whose text is about the topic, not pages that
# mention a word once (a news article on gambling regulation passes with one hit; a casino does not).
KEYWORDS = {
    "adult": ("porn", "porno", "xxx", "nsfw", "camgirl", "camgirls", "escort", "escorts", "hentai", "nude",
              "nudes", "sex cam", "adult videos"),
    "gambling": ("casino", "casinos", "slots", "slot machine", "jackpot", "sportsbook", "betting odds",
                 "roulette", "poker room", "free spins", "place your bets", "bookmaker"),
    "violent": ("gore", "beheading", "execution video", "snuff", "mass shooting video", "torture video",
                "kill yourself"),
}
MIN_HITS = 3


def _pattern(words: tuple[str, ...]) -> re.Pattern:
    return re.compile(r"\b(" + "|".join(re.escape(w) for w in words) + r")\b", re.I)


PATTERNS = {topic: _pattern(words) for topic, words in KEYWORDS.items()}


def page_text(page: dict) -> str:
    """The title and the names of the tree's nodes: what a reader of the screenshot sees."""
    return "\n".join([page.get("title") or ""] + [n["name"] for n in page.get("nodes", ()) if n["name"]])


def rule_reason(page: dict, min_text_chars: int = 200, min_hits: int = MIN_HITS) -> Optional[str]:
    """Why the rules drop a page (error_page, parked, too_little_text, adult, gambling, violent), or None."""
    title = page.get("title") or ""
    if ERROR_TITLES.search(title):
        return "error_page"
    text = page_text(page)
    if PARKED.search(text):
        return "parked"
    if page.get("text_chars", len(text)) < min_text_chars:
        return "too_little_text"
    for topic, pattern in PATTERNS.items():
        if len(pattern.findall(text)) >= min_hits:
            return topic
    return None


JUDGE_SYSTEM = ("You review web pages for a training set. Answer with one word: KEEP if the page is a normal, "
                "working page; otherwise one of ADULT, GAMBLING, VIOLENT, DISCRIMINATORY, ERROR.")
JUDGE_LABELS = {"keep": None, "adult": "adult", "gambling": "gambling", "violent": "violent",
                "discriminatory": "discriminatory", "error": "error_page"}


def judge_request(page: dict, tree_text: str, sampling: Sampling) -> Request:
    """Ask the LLM judge about one page, from its accessibility tree as text."""
    from transforms.io.ids import stable_id
    messages = ({"role": "system", "content": JUDGE_SYSTEM},
                {"role": "user", "content": f"Title: {page.get('title', '')}\nURL: {page.get('final_url', '')}\n"
                                            f"Accessibility tree:\n{tree_text}\n\nVerdict:"})
    return Request(stable_id("multiui-judge", page["id"]), messages, sampling)


def judge_reason(completion: Completion) -> tuple[Optional[str], Optional[str]]:
    """(reason to drop or None, problem) from the judge's answer; problem is set when the answer is
    not one of the labels (the page is then kept: an unreadable verdict is no evidence against it)."""
    words = re.findall(r"[a-z]+", completion.text.lower())
    for word in words[:5]:
        if word in JUDGE_LABELS:
            return JUDGE_LABELS[word], None
    return None, f"judge answered {completion.text[:60]!r}, not a label"
