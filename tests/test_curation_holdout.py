"""Curation rules on two labelled sets written blind to the rules, each page served at its labelled
URL and status. tests/data/curation_holdout/ was written first and measured once (precision 0.964,
recall 0.844); the rules were then generalised from its mistakes, so it is now a regression set.
tests/data/curation_blind2/ (40 pages) was written after that, again without seeing the rules, and
measures the rules as they are (1.000 / 0.962 when written).

curation_holdout: 48 pages (good ones with hard negatives: Essex, Scunthorpe, a museum's nude drawings, gambling-law news,
"kill a child process"; adult, gambling, error, parked, thin and non-English ones), each served at
its labelled URL with its labelled HTTP status and rendered in headless Chromium by the project's
Renderer, as the pipeline renders WARC records: sub-resources are aborted, a status >= 400 is a
RenderError (the pipeline's dead-letter row: the page never reaches the training data), counted as a
drop. The rows then go through curation.rule_reason with the default config's languages=en and
blocklists, as tests/test_web_curation.py runs its labelled set. Also the same HTML without a
browser (curation's HTML fallback), and with languages=any (the topic rules alone, no language ID).
"""
from __future__ import annotations

import html as htmllib
import json
import os
import re
import time

import pytest

from tests.test_web_curation import _has_datatrove_lists
from transforms.web import blocklist, curation
from transforms.web import render as R

DATA = os.path.join(os.path.dirname(__file__), "data")
SETS = ("curation_holdout", "curation_blind2")
CATEGORIES = ("good", "adult", "gambling", "error", "parked", "thin", "language")
EN = frozenset({"en"})


def _labels(name):
    with open(os.path.join(DATA, name, "labels.jsonl"), encoding="utf-8") as fh:
        labels = [json.loads(line) for line in fh if line.strip()]
    for lab in labels:
        with open(os.path.join(DATA, name, "pages", lab["file"]), encoding="utf-8") as fh:
            lab["html"] = fh.read()
    assert len(labels) >= 40
    return labels


def _rules(languages):
    lists = tuple(blocklist.DEFAULT.split(",")) if _has_datatrove_lists() else ()
    return curation.Rules(languages=languages, blocklists=lists)


class _Serve:
    """Replay-style route handler: the page itself from the held-out file, with its labelled status;
    every other request aborted (nothing is fetched)."""

    def __init__(self, lab):
        self.lab, self.refusals, self.failures = lab, [], []

    def __call__(self, route, request):
        if request.is_navigation_request() and request.url.split("#")[0] == self.lab["url"]:
            return route.fulfill(status=self.lab["status"], content_type="text/html; charset=utf-8",
                                 body=self.lab["html"].encode("utf-8"))
        return route.abort("blockedbyclient")


def _html_row(lab):
    m = re.search(r"<title[^>]*>(.*?)</title>", lab["html"], re.S | re.I)
    title = re.sub(r"\s+", " ", htmllib.unescape(m.group(1))).strip() if m else ""
    return {"id": lab["file"], "url": lab["url"], "final_url": lab["url"], "title": title, "html": lab["html"],
            "nodes": []}


# the tests that use `rendered` drive Chromium; the HTML fallback tests do not
FIXTURE_MARKS = {"rendered": "browser"}


@pytest.fixture(scope="module", params=SETS)
def rendered(request):
    """(label, row or the RenderError's message) per page of one set, rendered once for the module."""
    if not os.path.exists(R.CHROMIUM):
        pytest.skip(f"needs Chromium at {R.CHROMIUM}")
    labels, out = _labels(request.param), []
    start = time.perf_counter()
    renderer = R.Renderer()
    try:
        for lab in labels:
            try:
                row = renderer.render_page(lab["url"], "desktop", 0, route_handler=_Serve(lab), timeout_ms=15000,
                                           follow_links=0)
                row["id"] = lab["file"]
                out.append((lab, row))
            except R.RenderError as e:
                out.append((lab, f"render error: {e}"))
    finally:
        renderer.close()
    print(f"\nrendered {len(out)} pages of {request.param} in {time.perf_counter() - start:.1f} s")
    return out


def _evaluate(title, results, rules):
    """Print the per-category table; return (precision, recall, mistakes) of 'drop'."""
    expected = lambda lab: "keep" if rules.languages is None and lab["category"] == "language" else lab["label"]
    per = {c: [0, 0] for c in CATEGORIES}
    tp = fp = fn = 0
    wrong = []
    for lab, row in results:
        reason = row if isinstance(row, str) else curation.rule_reason(row, rules=rules)
        want_drop, dropped = expected(lab) == "drop", reason is not None
        per[lab["category"]][0] += 1
        per[lab["category"]][1] += want_drop == dropped
        tp, fp, fn = tp + (want_drop and dropped), fp + (dropped and not want_drop), fn + (want_drop and not dropped)
        if want_drop != dropped:
            wrong.append((lab["file"], expected(lab), reason))
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    print(f"\n{title}\n{'category':10} {'pages':>5} {'correct':>7}")
    for c in CATEGORIES:
        print(f"{c:10} {per[c][0]:5d} {per[c][1]:7d}")
    print(f"{'total':10} {len(results):5d} {sum(ok for _, ok in per.values()):7d}")
    print(f"drop: TP {tp} FP {fp} FN {fn}  precision {precision:.3f} recall {recall:.3f}; mistakes: {wrong or 'none'}")
    return precision, recall, wrong


def _good_pages_kept(results, rules):
    dropped = [(lab["file"], row if isinstance(row, str) else curation.rule_reason(row, rules=rules))
               for lab, row in results if lab["category"] == "good"]
    return [d for d in dropped if d[1] is not None]


def test_holdout_rendered_in_chromium(rendered):
    rules = _rules(EN)
    title = f"held-out set, rendered, languages=en, blocklists={rules.blocklists or 'none'}"
    precision, recall, wrong = _evaluate(title, rendered, rules)
    assert precision >= 0.95 and recall >= 0.9, wrong
    assert not _good_pages_kept(rendered, rules)


def test_holdout_rendered_topic_rules_without_language_id(rendered):
    """languages=any: the adult and gambling pages in es, ru, id, ja, zh, de, pt are dropped by their
    words, not only because they are not English."""
    rules = _rules(None)
    precision, recall, wrong = _evaluate("held-out set, rendered, languages=any", rendered, rules)
    assert precision >= 0.95 and recall >= 0.9, wrong
    reasons = {lab["file"]: curation.rule_reason(row, rules=rules) for lab, row in rendered if not isinstance(row, str)}
    for lab, _ in rendered:
        if lab["category"] in ("adult", "gambling") and lab["language"] != "en":
            assert reasons[lab["file"]] == lab["category"], (lab["file"], reasons[lab["file"]])


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("languages", [EN, None], ids=["en", "any"])
def test_holdout_html_fallback(languages, name):
    """The same pages as rows with only their HTML (no tree, no HTTP status)."""
    rules = _rules(languages)
    results = [(lab, _html_row(lab)) for lab in _labels(name)]
    title = f"held-out set, HTML only, languages={'any' if languages is None else 'en'}"
    precision, recall, wrong = _evaluate(title, results, rules)
    assert precision >= 0.95 and recall >= 0.85, wrong      # error_500 and error_access_denied say so only by status
    assert not _good_pages_kept(results, rules)
