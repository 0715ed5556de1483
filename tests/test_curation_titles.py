"""Curation of pages whose head lies: tests/data/curation_titles/ (54 pages, written blind to the rules)
holds English bodies under hijacked titles, descriptions or keywords (adult, gambling, or spam in
another language) and legitimate pages with hard negatives (bilingual titles, quotations in other
scripts, brand names in CJK, museum nudes, gambling-law news). Measured as HTML-only rows, with
languages=en and languages=any; a sample rendered in Chromium as tests/curation_sets.py renders the
other blind sets must get the same verdicts.

Two more sets were written blind after the rules and measure them (HTML only): curation_titles2/ (40
pages: precision 1.000, recall 0.900) and curation_titles3/ (40 pages of short heads in close
languages: precision 1.000, recall 0.917). Measured on 2026-12-02, the first set the same in all
four ways: before the head rules, precision 0.800 and recall
0.148 of "drop" (4 of 27 hijacks, the heads with three topic words the page rule counts); after, 0.962
and 0.926. Missed: page_35 and page_49, English escort and hook-up spam appended to a genuine English
title in words the topic lists hold only as topical (escorts, adult dating) or not at all.
"""
from __future__ import annotations

import html as htmllib

import pytest

from tests import curation_sets as S
from transforms.web import curation, head

NAME = "curation_titles"
EN = frozenset({"en"})
# Good pages the rules drop, and why. page_53 (pussy willow) is in its URL: datatrove's URL word list
# drops it, as FineWeb (the paper's source) does; the blocklist follows FineWeb on purpose.
KNOWN_DROPPED = {"page_53.html": "blocklist url_words: word 'pussy'"}

# the tests that use `rendered` drive Chromium; the HTML fallback tests do not
FIXTURE_MARKS = {"rendered": "browser"}


@pytest.fixture(scope="module")
def rendered():
    return S.render(NAME)


def _check(title, results, languages):
    """Precision and recall of 'drop' a little under the measured 0.962 / 0.926; every good page kept
    but KNOWN_DROPPED."""
    rules = S.rules(languages)
    precision, recall, wrong = S.evaluate(title, results, rules)
    assert precision >= 0.95 and recall >= 0.9, wrong
    assert dict(S.good_pages_dropped(results, rules)) == (KNOWN_DROPPED if rules.blocklists else {})


@pytest.mark.parametrize("languages", [EN, None], ids=["en", "any"])
def test_titles_rendered_in_chromium(rendered, languages):
    """A sample rendered (tests/curation_sets.py says why not all): the verdicts of the HTML rows."""
    rules = S.rules(languages)
    S.evaluate(f"curation_titles sample, rendered, languages={'any' if languages is None else 'en'}", rendered, rules)
    S.assert_rendered_like_html(rendered, rules)


@pytest.mark.parametrize("languages", [EN, None], ids=["en", "any"])
def test_titles_html_fallback(languages):
    results = [(lab, S.html_row(lab)) for lab in S.labels(NAME)]
    _check(f"curation_titles, HTML only, languages={'any' if languages is None else 'en'}", results, languages)


@pytest.mark.parametrize("languages", [EN, None], ids=["en", "any"])
@pytest.mark.parametrize("name", ["curation_titles2", "curation_titles3"])
def test_blind_sets_written_after_the_rules(name, languages):
    """Sets written blind after the rules were made from the first set, so they measure the rules
    rather than their tuning; HTML only, no good page dropped.
    - curation_titles2/ (40 pages): precision 1.000 and recall 0.900 when written (misses: page_07,
      sports-betting tips appended to a little league's real title; page_19, a Hindi satta-matka title).
    - curation_titles3/ (40 pages, short heads in languages close to each other or to English),
      written after the language detector moved to trigrams only: precision 1.000 and recall 0.917
      in both detector modes, the same 80 verdicts (misses: page_06, a Czech payday-loan title over
      an honest English description; page_27, an Italian replica-watch description under an honest
      English title)."""
    results = [(lab, S.html_row(lab)) for lab in S.labels(name)]
    rules = S.rules(languages)
    precision, recall, wrong = S.evaluate(f"{name}, HTML only, languages={languages}", results, rules)
    assert precision >= 0.95 and recall >= 0.85, wrong
    assert S.good_pages_dropped(results, rules) == []


# -- each reason on hand-made rows ------------------------------------------------------------------------

BODY = ("Our bakery opens at seven every morning. We bake sourdough, rye and seeded loaves in a wood-fired oven, "
        "and on Saturdays there are cinnamon buns and fruit tarts. The shop is on the corner of Mill Lane and "
        "the high street, next to the library, and we deliver to cafes in the town every weekday. Gluten-free "
        "loaves can be ordered a day ahead; ask at the counter or ring the shop before noon.")


def _row(title, description="", keywords="", body=BODY):
    """A rendered-looking row: the body as the tree's text, the head in the HTML."""
    meta = "".join(f'<meta content="{htmllib.escape(v)}" name="{k}">'
                   for k, v in (("description", description), ("keywords", keywords)) if v)
    return {"id": "r", "url": "https://millane.example/", "final_url": "https://millane.example/", "title": title,
            "html": f"<html><head><title>{htmllib.escape(title)}</title>{meta}</head><body><p>{body}</p></body></html>",
            "nodes": [{"role": "StaticText", "name": body}], "text_chars": len(body)}


@pytest.mark.parametrize("languages", [EN, None], ids=["en", "any"])
@pytest.mark.parametrize("row, reason", [
    (_row("Mill Lane Bakery – Free Porn Videos"), "title_adult"),
    (_row("Mill Lane Bakery | Claim 100 Free Spins Today"), "title_gambling"),
    (_row("Mill Lane Bakery", description="Hot singles near you: live sex chat, no sign-up."), "description_adult"),
    (_row("Mill Lane Bakery", description="Best casino of the year: deposit bonus and free spins."),
     "description_gambling"),
    (_row("Mill Lane Bakery", keywords="bakery, sourdough, xxx, free porn"), "keywords_adult"),
    (_row("Mill Lane Bakery", keywords="bakery, bread, bet slip, odds boost"), "keywords_gambling"),
    (_row("Сантехника оптом по низким ценам с доставкой по всей стране"), "title_language: ru (page en)"),
    (_row("Mill Lane Bakery", description="Jual sepatu murah berkualitas dengan pengiriman ke seluruh Indonesia."),
     "description_language: id (page en)"),
])
def test_a_head_that_says_what_the_body_does_not(row, reason, languages):
    assert curation.rule_reason(row, rules=curation.Rules(languages=languages, blocklists=())) == reason


@pytest.mark.parametrize("languages", [EN, None], ids=["en", "any"])
@pytest.mark.parametrize("row", [
    _row("Mill Lane Bakery | ミルレーン・ベーカリー"),                                  # a bilingual title
    _row("磨坊巷 Mill Lane Bakery", body=BODY + " Our name, 磨坊巷, is the lane's in Chinese."),  # a brand the body has
    _row("«Хлеб всему голова» – Mill Lane Bakery on Bread and Proverbs"),            # a quotation beside English
    _row("Mill Lane Bakery", description="Sourdough and rye from a wood-fired oven. 薪窯で焼いたサワードウとライ麦パン。"),
    _row("Mill Lane Bakery", keywords="bakery, sourdough, Bäckerei, panadería, パン屋"),   # keywords: any language
    _row("Mill Lane Bakery", description="Sourdough, rye and seeded loaves, baked every morning near the library."),
    _row("No free spins: why bread is never a gamble", body=BODY + " Free spins belong elsewhere; we do buns."),
    _row("Mill Lane Bakery – Home", description="Welcome to our website."),
])
def test_a_head_that_agrees_with_its_body_is_kept(row, languages):
    assert curation.rule_reason(row, rules=curation.Rules(languages=languages, blocklists=())) is None


def test_an_english_head_over_a_page_in_another_language_is_kept_with_languages_any():
    """The head must be in the page's language or in English; languages=any keeps every page's language."""
    de = ("Unsere Bäckerei öffnet jeden Morgen um sieben Uhr. Wir backen Sauerteigbrot, Roggenbrot und "
          "Körnerbrote im Holzofen, und samstags gibt es Zimtschnecken und Obstkuchen. Der Laden liegt an der "
          "Ecke Mühlweg und Hauptstraße, gleich neben der Bücherei, und wir beliefern werktags die Cafés der Stadt.")
    rules = curation.Rules(languages=None, blocklists=())
    english = _row("Mill Lane Bakery – Sourdough and Rye Bread since 1987", body=de)
    assert curation.rule_reason(english, rules=rules) is None
    assert curation.rule_reason(_row("Mühlweg Bäckerei – Sauerteigbrot und Roggenbrot", body=de), rules=rules) is None
    spam = _row("Сантехника оптом по низким ценам с доставкой по всей стране", body=de)
    assert curation.rule_reason(spam, rules=rules) == "title_language: ru (page de)"
    assert curation.rule_reason(spam, rules=curation.Rules(languages=EN, blocklists=())) == "language: de (not in en)"


def test_head_fields_are_read_from_the_html_head():
    html = ('<html><head><title>T</title><META NAME="Description" CONTENT="Fish &amp; chips\n by the sea">'
            "<meta name='keywords' content='fish, chips'><meta property='og:title' content='Other'></head>"
            '<body><meta name="description" content="not the head"></body></html>')
    assert head.fields({"title": " Fish  shop ", "html": html}) == {
        "title": "Fish shop", "description": "Fish & chips by the sea", "keywords": "fish, chips"}
    assert head.fields({"title": "Fish shop"}) == {"title": "Fish shop"}                  # no HTML: the title alone
    assert head.fields({"title": "", "html": '<meta name="description" content="">'}) == {}
