"""Curation rules on two labelled sets written blind to the rules, each page served at its labelled
URL and status. tests/data/curation_holdout/ was written first and measured once (precision 0.964,
recall 0.844); the rules were then generalised from its mistakes, so it is now a regression set.
tests/data/curation_blind2/ (40 pages) was written after that, again without seeing the rules, and
measures the rules as they are (1.000 / 0.962 when written).

curation_holdout: 48 pages (good ones with hard negatives: Essex, Scunthorpe, a museum's nude drawings, gambling-law news,
"kill a child process"; adult, gambling, error, parked, thin and non-English ones), each served at
its labelled URL with its labelled HTTP status. Measured on all pages as rows with only their HTML
(curation's HTML fallback) through curation.rule_reason with the default config's languages=en and
blocklists, as tests/test_web_curation.py runs its labelled set, and with languages=any (no page
dropped for the language of its text). A sample is rendered in headless Chromium by the project's
Renderer (tests/curation_sets.py: a status >= 400 is a RenderError, counted as a drop) and must get
the HTML rows' verdicts.
"""
from __future__ import annotations

import pytest

from tests import curation_sets as S

SETS = ("curation_holdout", "curation_blind2")
EN = frozenset({"en"})

# the tests that use `rendered` drive Chromium; the HTML fallback tests do not
FIXTURE_MARKS = {"rendered": "browser"}


def _expected(rules):
    """With languages=any a page whose only fault is its language is kept."""
    return lambda lab: "keep" if rules.languages is None and lab["category"] == "language" else lab["label"]


@pytest.fixture(scope="module", params=SETS)
def rendered(request):
    """(label, row or the RenderError's message) per page of one set, rendered once for the module."""
    return S.render(request.param)


def test_holdout_rendered_in_chromium(rendered):
    """A sample rendered (tests/curation_sets.py says why not all): the verdicts of the HTML rows."""
    rules = S.rules(EN)
    title = f"held-out sample, rendered, languages=en, blocklists={rules.blocklists or 'none'}"
    S.evaluate(title, rendered, rules, _expected(rules))
    S.assert_rendered_like_html(rendered, rules)
    assert not S.good_pages_dropped(rendered, rules)


def test_holdout_rendered_topic_rules_without_language_id(rendered):
    """languages=any: the adult and gambling pages in es, ru, id, ja, zh, de, pt are dropped by their
    words, not only because they are not English."""
    rules = S.rules(None)
    S.evaluate("held-out sample, rendered, languages=any", rendered, rules, _expected(rules))
    S.assert_rendered_like_html(rendered, rules)
    foreign = [lab for lab, _ in rendered if lab["category"] in ("adult", "gambling") and lab["language"] != "en"]
    assert foreign, "the sample holds no adult or gambling page in another language"
    for lab, row in rendered:
        if lab["category"] in ("adult", "gambling") and lab["language"] != "en":
            assert S.reason(row, rules) == lab["category"], (lab["file"], S.reason(row, rules))


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("languages", [EN, None], ids=["en", "any"])
def test_holdout_html_fallback(languages, name):
    """The same pages as rows with only their HTML (no tree, no HTTP status)."""
    rules = S.rules(languages)
    results = [(lab, S.html_row(lab)) for lab in S.labels(name)]
    title = f"{name}, HTML only, languages={'any' if languages is None else 'en'}"
    precision, recall, wrong = S.evaluate(title, results, rules, _expected(rules))
    assert precision >= 0.95 and recall >= 0.85, wrong      # error_500 and error_access_denied say so only by status
    assert not S.good_pages_dropped(results, rules)


def test_a_labelled_url_is_served_however_chromium_encodes_it():
    """Labels write URLs as a person reads them; Chromium asks for them encoded (a page of set 28,
    "…/wiki/Pişti", was aborted as a sub-resource until the harness compared them decoded)."""
    assert S.same_url("https://tr.oyunansiklopedisi.org/wiki/Pi%C5%9Fti", "https://tr.oyunansiklopedisi.org/wiki/Pişti")
    assert S.same_url("https://xn--bcher-kva.example/a#top", "https://bücher.example/a")
    assert S.same_url("https://a.example", "https://a.example/")
    assert not S.same_url("https://a.example/b", "https://a.example/c")
    assert not S.same_url("https://a.example/b?x=1", "https://a.example/b?x=2")
