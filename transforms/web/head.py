"""What a page's head says, field by field, and which of it the body does not say.

A hijacked site keeps its body and rewrites its head: an English chemicals trader under a Chinese
title advertising pornographic videos. The title reaches the caption and heading tasks, so curation
judges the title, the meta description and the meta keywords each on their own against the visible
text (curation.head_topic_reason, curation.head_language_reason). No model reads the keywords, but
stuffed with casino or porn terms they are the hijacker's footprint: whoever wrote them controls the
page. og:title and og:description are not read: a link preview's copies of the title and description,
they add nothing a model reads, only more places to misjudge.

A genuine head shares words with its body: the site's name, the topic, a quotation or a brand name in
another script that the body repeats. `own_text` is what remains of a field without them, the part
that has to stand on its own.
"""
from __future__ import annotations

import collections
import functools
import itertools
import re
import unicodedata
from html import unescape

from transforms.web import language

_BODY = re.compile(r"<body\b", re.I)
_META = re.compile(r"<meta\b[^>]*>", re.I | re.S)
_ATTR = re.compile(r"""([\w:.-]+)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))""", re.S)
_SPACE = re.compile(r"\s+")
_LETTER = re.compile(r"[^\W\d_]")
EVERYDAY = 20


@functools.lru_cache(maxsize=1)
def _word_pattern() -> re.Pattern:
    """Runs of letters, digits and combining marks: Python's \\w leaves out the marks, the vowel signs
    of Indic scripts among them, and would cut a Hindi word in pieces."""
    marks = [cp for cp in range(0x10000) if unicodedata.category(chr(cp))[0] == "M"]
    ranges, start = [], marks[0]
    for prev, cp in zip(marks, marks[1:] + [None]):
        if cp != prev + 1:
            ranges.append(f"\\u{start:04x}-\\u{prev:04x}")
            start = cp
    return re.compile(f"(?:[^\\W_]|[{''.join(ranges)}])+")


def fields(page: dict) -> dict[str, str]:
    """The page's title, meta description and meta keywords (those it has), whitespace collapsed. The
    meta tags come from the head of the row's HTML (the rendered DOM, or the archived document)."""
    out = {"title": _SPACE.sub(" ", page.get("title") or "").strip()}
    html = (page.get("html") or "")[:200_000]
    body = _BODY.search(html)
    for tag in _META.findall(html[:body.start()] if body else html):
        attrs = {m.group(1).lower(): m.group(2) or m.group(3) or m.group(4) or "" for m in _ATTR.finditer(tag)}
        name = attrs.get("name", "").lower()
        if name in ("description", "keywords") and name not in out:
            out[name] = _SPACE.sub(" ", unescape(attrs.get("content", ""))).strip()
    return {k: v for k, v in out.items() if v}


def body_words(body: str) -> collections.Counter:
    """The body's words, case-folded, with their counts."""
    return collections.Counter(w.casefold() for w in words(body))


def everyday_words(words: collections.Counter) -> frozenset[str]:
    """The body's most frequent words (EVERYDAY of them, numbers left out): in any language mostly its
    function words ('the', 'and', 'in'; 'und', 'der'), which a title or description in the page's
    language tends to use too, however many foreign names it carries."""
    common = (w for w, _ in words.most_common() if not any(ch.isdigit() for ch in w))
    return frozenset(itertools.islice(common, EVERYDAY))


def words(text: str) -> list[str]:
    """The words of `text` (runs of letters, digits and marks), in any script."""
    return _word_pattern().findall(text)


def own_text(field: str, body: str, known: collections.Counter) -> str:
    """The words of `field` that the body does not have (a run of Chinese, Japanese, Korean, Thai or
    Arabic letters: that the body does not have as a substring, those scripts not spacing their words)."""
    return " ".join(w for w in words(field)
                    if not (w in body if language.DENSE_CHAR.search(w) else w.casefold() in known))


def letters(text: str) -> int:
    """How many letters `text` has: how much of a field a part of it is."""
    return len(_LETTER.findall(text))


def weight(text: str) -> int:
    """Letters, a Chinese, Japanese or Korean character counted as three (about a word's worth): how
    much there is to identify a language by."""
    return letters(text) + 2 * len(language.CJK_CHAR.findall(text))
