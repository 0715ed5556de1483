"""Curation in the languages a crawl keeps, measured on sets written blind to the rules.

Three sets, each written by helpers who had read neither the rules nor the sets before it, in zh, ja,
ru, de, es, fr, pt, it, pl, nl, tr, vi, id, ko, ar and en (good pages with hard negatives, adult,
gambling and lottery, error and parked pages): tests/data/curation_multilingual/ (112 pages),
curation_multilingual2/ (96) and curation_multilingual3/ (128, with two hard negatives a language).
Measured with languages=any, so no page is dropped for its language: a harm or error judgement must
come from the rules themselves. Each page is an HTML-only row (curation's fallback), a page served
with status >= 400 a drop (as the renderer's RenderError is).

Precision / recall of "drop", by words alone and then with the multilingual topic model
(transforms/web/topic_model.py), 2026-12-05:

    set                       when written  own-domain rule  topic model
    curation_multilingual     0.96 / 0.80   0.96 / 0.86      0.97 / 0.97   (rules tuned here)
    curation_multilingual2    0.94 / 0.73   0.95 / 0.81      0.95 / 0.95   (the model's generic benign
                                                                            descriptions came after its misses)
    curation_multilingual3                  0.95 / 0.76      0.95 / 0.94   (held out: measured once, blind)

The floor test keeps each set from getting worse than that; the target test is the one
docs/papers/multiui.md sets: every language group at precision >= 0.95 and recall >= 0.90. No set
meets it yet (strict xfail); the third is the honest figure: tune on the first two, and write a new
blind set before claiming a change on it.
"""
from __future__ import annotations

import collections

import pytest

from tests import curation_sets as S

# each set's floor, as last measured (the docstring's table): (precision, drops found of drops)
FLOORS = {"curation_multilingual": (0.96, 62 / 64), "curation_multilingual2": (0.95, 61 / 64),
          "curation_multilingual3": (75 / 79, 75 / 80)}
GROUPS = {"cjk": ("zh", "ja", "ko"), "cyrillic": ("ru",), "latin_europe": ("de", "es", "fr", "pt", "it", "pl", "nl", "tr"),
          "southeast_asia": ("vi", "id"), "arabic": ("ar",), "english": ("en",)}


@pytest.fixture(scope="module", params=sorted(FLOORS))
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
                                                ("curation_multilingual3", 8)])
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


OPEN = pytest.mark.xfail(strict=True, reason="open: hard negatives dropped by words (news of a "
                                             "crackdown, a dating column) and some gambling pages in ar, pt, fr kept "
                                             "(docs/papers/multiui.md, curation in every language)")


@pytest.mark.parametrize("measured", [pytest.param("curation_multilingual", marks=OPEN), pytest.param("curation_multilingual2", marks=OPEN),
                                      pytest.param("curation_multilingual3", marks=OPEN)], indirect=True)
def test_every_language_group_meets_the_target(measured):
    scores, wrong, _ = measured
    below = {k: v for k, v in scores.items() if v[0] < 0.95 or v[1] < 0.90}
    assert not below, (below, wrong)
