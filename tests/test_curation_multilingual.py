"""Curation in the languages a crawl keeps, measured on a set written blind to the rules.

tests/data/curation_multilingual/ (112 pages: 7 in each of zh, ja, ru, de, es, fr, pt, it, pl, nl,
tr, vi, id, ko, ar and en; good pages with hard negatives, adult, gambling and lottery, error and
parked pages) was written by a helper who had not read the rules. Measured with languages=any, so
no page is dropped for its language: a harm or error judgement must come from the rules themselves.
Each page is an HTML-only row (curation's fallback), a page served with status >= 400 a drop (as the
renderer's RenderError is).

When written (2026-12-05), before any rule was changed for it: precision 0.96, recall 0.80 overall;
recall 0.25 for pl, 0.50 for ar; two hard negatives dropped (id lottery-regulation news, a de
museum's classical nudes). tests/data/curation_multilingual2/ (96 pages, 6 a language) was written
after, by another helper who had seen neither the rules nor the first set: precision 0.94, recall
0.73. Keep it held out: tune on the first set, measure a change on the second. A parked page that
names its own host (curation.names_its_own_domain), tuned on the first set: 0.96 / 0.86 there, and on
the held-out set 0.95 / 0.81 (parked pages missed: 6 of 16 -> 1). The floor test keeps
each from getting worse; the target test (strict xfail) is the one docs/papers/multiui.md sets:
every language group at precision >= 0.95 and recall >= 0.90.
"""
from __future__ import annotations

import collections

import pytest

from tests import curation_sets as S

# each set's floor when it was written, before any rule change: (precision, drops found of drops)
FLOORS = {"curation_multilingual": (0.96, 55 / 64), "curation_multilingual2": (0.94, 52 / 64)}
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


@pytest.mark.parametrize("name, per_language", [("curation_multilingual", 7), ("curation_multilingual2", 6)])
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


@pytest.mark.xfail(strict=True, reason="open: adult and gambling pages in pl, ar, tr, fr, ru and pt kept; "
                                       "hard negatives dropped (docs/papers/multiui.md, curation in every language)")
def test_every_language_group_meets_the_target(measured):
    scores, wrong, _ = measured
    below = {k: v for k, v in scores.items() if v[0] < 0.95 or v[1] < 0.90}
    assert not below, (below, wrong)


def test_a_short_page_about_its_own_domain_is_parked():
    """The structure of a parking or for-sale page, in words no rule lists: its own host in the title,
    a word for "domain", little else. A real site titled with its host, or a short page that does not
    speak of a domain, is kept."""
    from transforms.web import curation
    rules = curation.Rules(languages=None, blocklists=())

    def page(url, title, body):
        html = f"<html><head><title>{title}</title></head><body><h1>{title}</h1><p>{body}</p></body></html>"
        return {"url": url, "final_url": url, "title": title, "html": html, "nodes": []}

    sale = ("Ta domena czeka na nowego właściciela. Cena do negocjacji, faktura VAT, bezpieczny transfer przez "
            "serwis pośredniczący. Skontaktuj się z nami, aby złożyć ofertę na ten adres internetowy.")
    assert curation.rule_reason(page("https://www.ogrodnik-x.pl/", "ogrodnik-x.pl", sale), rules=rules) == "parked"
    about = ("Fotografie aus Kyoto: Tempel im Herbst, Gassen in Gion, Teehäuser am Abend. Neue Bilder jede Woche, "
             "Drucke auf Anfrage, Workshops im Frühjahr und Herbst für Anfänger und Fortgeschrittene.")
    assert curation.rule_reason(page("https://kazu-photo.de/", "kazu-photo.de", about), rules=rules) is None
    long_news = (sale.replace("Ta domena", "Każda domena") + " ") * 6   # a long page about domains is an article
    assert curation.rule_reason(page("https://news-x.pl/", "news-x.pl: domeny", long_news), rules=rules) is None
