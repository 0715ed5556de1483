"""Curation in the languages a crawl keeps, measured on sets written blind to the rules.

Four sets, each written by helpers who had read neither the rules nor the sets before it, in zh, ja,
ru, de, es, fr, pt, it, pl, nl, tr, vi, id, ko, ar and en (good pages with hard negatives, adult,
gambling and lottery, error and parked pages): tests/data/curation_multilingual/ (112 pages),
curation_multilingual2/ (96), curation_multilingual3/ and curation_multilingual4/ (128 each, with two
hard negatives and two gambling pages a language). Measured with languages=any, so no page is dropped
for its language: a harm or error judgement must come from the rules themselves. Each page is an
HTML-only row (curation's fallback), a page served with status >= 400 a drop (as the renderer's
RenderError is).

Precision / recall of "drop", 2026-12-05: by words alone, when each set was written; after the
own-domain parked rule (words alone); and with the multilingual model (transforms/web/topic_model.py:
adult and gambling on every page, error and parked on short ones, and the sentences holding a
topic's words read as reporting or as an offer):

    set                       when written  own-domain rule  with the model
    curation_multilingual     0.96 / 0.80   0.96 / 0.86      1.00 / 0.98   (tuned here)
    curation_multilingual2    0.94 / 0.73   0.95 / 0.81      0.97 / 0.98   (tuned here)
    curation_multilingual3                  0.95 / 0.76      0.96 / 0.96   (first scored blind: 0.95 / 0.94
                                                                            with adult and gambling only; then
                                                                            tuned here)
    curation_multilingual4                  0.95 / 0.66      0.96 / 0.88   (held out: scored once, blind)

The floor test keeps each set from getting worse than that; the target test is the one
docs/papers/multiui.md sets: every language group at precision >= 0.95 and recall >= 0.90. The first
set meets it; the others not yet (strict xfail). The fourth is the honest figure: tune on the first
three, and write a new blind set before claiming a change on it.
"""
from __future__ import annotations

import collections

import pytest

from tests import curation_sets as S

# each set's floor, as last measured (the docstring's table): (precision, drops found of drops)
FLOORS = {"curation_multilingual": (1.0, 63 / 64), "curation_multilingual2": (63 / 65, 63 / 64),
          "curation_multilingual3": (77 / 80, 77 / 80), "curation_multilingual4": (70 / 73, 70 / 80)}
GROUPS = {"cjk": ("zh", "ja", "ko"), "cyrillic": ("ru",), "latin_europe": ("de", "es", "fr", "pt", "it", "pl", "nl", "tr"),
          "southeast_asia": ("vi", "id"), "arabic": ("ar",), "english": ("en",)}


# the fast tier measures the set the rules were first tuned on and the held-out one; the full run all four
TIERS = {"curation_multilingual2": pytest.mark.slow, "curation_multilingual3": pytest.mark.slow}


@pytest.fixture(scope="module", params=[pytest.param(n, marks=TIERS.get(n, [])) for n in sorted(FLOORS)])
def measured(request):
    """{group: (precision, recall)} of 'drop' and the pages judged wrong, printed as a table; the set."""
    rules = S.rules(None)
    counts = collections.defaultdict(lambda: [0, 0, 0])     # tp, fp, fn
    wrong = []
    group_of = {lang: group for group, langs in GROUPS.items() for lang in langs}
    for lab in S.labels(request.param):
        row = S.html_row(lab) if lab["status"] < 400 else f"HTTP {lab['status']}"
        dropped, want = S.reason(row, rules) is not None, lab["label"] == "drop"
        for key in (group_of[lab["language"]], "all"):
            c = counts[key]
            c[0] += want and dropped
            c[1] += dropped and not want
            c[2] += want and not dropped
        if dropped != want:
            wrong.append((lab["language"], lab["category"], lab["file"]))
    scores = {k: (tp / (tp + fp) if tp + fp else 1.0, tp / (tp + fn) if tp + fn else 1.0)
              for k, (tp, fp, fn) in counts.items()}
    print(f"\n{request.param}\n" + "\n".join(f"{k:15s} precision {p:.2f} recall {r:.2f}"
                                           for k, (p, r) in sorted(scores.items())))
    return scores, wrong, request.param


@pytest.mark.parametrize("name, per_language", [("curation_multilingual", 7), ("curation_multilingual2", 6),
                                                ("curation_multilingual3", 8), ("curation_multilingual4", 8)])
def test_every_language_is_measured(name, per_language):
    labs = S.labels(name)
    assert collections.Counter(lab["language"] for lab in labs) == {lang: per_language for langs in GROUPS.values()
                                                                    for lang in langs}
    assert {lab["category"] for lab in labs} == {"good", "adult", "gambling", "error", "parked"}


def test_multilingual_floor(measured):
    """No worse than when each set was written (FLOORS)."""
    scores, wrong, name = measured
    precision, recall = scores["all"]
    floor_precision, floor_recall = FLOORS[name]
    assert precision >= floor_precision and recall >= floor_recall, wrong


OPEN = pytest.mark.xfail(strict=True, reason="open: gambling pages the model scores just under its threshold in "
                                             "ar, de, fr, ja, nl, pt; hard negatives (a lottery winner's news, a "
                                             "dating column) dropped (docs/papers/multiui.md, curation in every "
                                             "language)")


@pytest.mark.parametrize("measured", ["curation_multilingual",
                                      *(pytest.param(n, marks=[OPEN, *([TIERS[n]] if n in TIERS else [])])
                                        for n in sorted(FLOORS)[1:])],
                         indirect=True)
def test_every_language_group_meets_the_target(measured):
    scores, wrong, _ = measured
    below = {k: v for k, v in scores.items() if v[0] < 0.95 or v[1] < 0.90}
    assert not below, (below, wrong)
