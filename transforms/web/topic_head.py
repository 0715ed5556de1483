"""Fit curation's topic head (transforms/web/topic_model.py) from labelled page sets, and write it.

    python -m transforms.web.topic_head tests/data [--out transforms/web/topic_head.json]

The head is a softmax regression over the encoder's 512 numbers for a page's first 1,000 characters:
other, adult, gambling, error, parked. Its pages are the labelled curation sets
(topic_model.TRAINING_SETS: every page of each set served with status 200, read as curation reads a
row without a tree: the title and the HTML's text); a page is of a class when its label is drop and
its category names the class, other otherwise (good pages, thin and foreign-language drops, and
hijacked heads over a benign body, whose visible text is not the business). Fitting is plain
full-batch gradient descent from zeros, so the same pages give the same head on any machine, bit for
bit within float rounding: a test refits it and compares. Classes are weighted to equal totals, since good pages outnumber each topic.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

import numpy as np

from transforms.web import curation, topic_model

STEPS, RATE, L2 = 3000, 0.5, 1 / 30


def label_of(lab: dict) -> str:
    """other, adult, gambling, error or parked, from a labels.jsonl line."""
    category = str(lab.get("category") or "")
    if lab["label"] == "drop" and category in topic_model.CLASSES[1:]:
        return category
    return "other"


def page_text(html: str) -> str:
    """What curation reads of a page that has only its HTML: the title, then the visible text."""
    return re.sub(r"\s+", " ", curation.page_text({"title": curation.html_title(html), "html": html, "nodes": []}))


def examples(data_dir: str, sets=topic_model.TRAINING_SETS) -> tuple[list[str], list[str]]:
    """(texts, labels) of every page served with status 200 in the sets under `data_dir`."""
    texts, labels = [], []
    for name in sets:
        with open(os.path.join(data_dir, name, "labels.jsonl"), encoding="utf-8") as fh:
            for line in fh:
                lab = json.loads(line) if line.strip() else None
                if lab is None or lab.get("status", 200) >= 400:
                    continue
                with open(os.path.join(data_dir, name, "pages", lab["file"]), encoding="utf-8") as page:
                    texts.append(page_text(page.read()))
                labels.append(label_of(lab))
    return texts, labels


def fit(x: np.ndarray, labels: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(w, b) of the softmax regression of `labels` (topic_model.CLASSES) on the rows of `x`."""
    classes = topic_model.CLASSES
    y = np.array([classes.index(v) for v in labels])
    n, k = len(y), len(classes)
    onehot = np.eye(k)[y]
    weight = (n / (k * np.maximum(np.bincount(y, minlength=k), 1)))[y][:, None] / n
    x = x.astype(np.float64)
    w, b = np.zeros((x.shape[1], k)), np.zeros(k)
    for _ in range(STEPS):
        grad = (topic_model.softmax(x @ w + b) - onehot) * weight
        w -= RATE * (x.T @ grad + L2 * w / n)
        b -= RATE * grad.sum(axis=0)
    return w, b


def head(data_dir: str) -> dict:
    """The head file's content, fitted on the sets under `data_dir`."""
    texts, labels = examples(data_dir)
    w, b = fit(topic_model.TopicModel(head_path=None).embed(texts), labels)
    counts = {c: labels.count(c) for c in topic_model.CLASSES}
    return {"classes": list(topic_model.CLASSES), "fitted_on": list(topic_model.TRAINING_SETS), "pages": counts,
            "w": np.round(w, 6).tolist(), "b": np.round(b, 6).tolist()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data_dir", help="the folder holding the labelled sets (tests/data)")
    ap.add_argument("--out", default=topic_model.HEAD, help="where to write the head (default: the package's)")
    args = ap.parse_args(argv)
    missing = [s for s in topic_model.TRAINING_SETS if not os.path.isfile(os.path.join(args.data_dir, s, "labels.jsonl"))]
    if missing:
        print(f"topic_head: {args.data_dir} lacks {', '.join(missing)}; give the folder holding the labelled sets "
              "(tests/data)", file=sys.stderr)
        return 2
    fitted = head(args.data_dir)
    with open(args.out, "w") as fh:
        json.dump(fitted, fh, separators=(",", ":"))
        fh.write("\n")
    print(f"wrote {args.out}: {fitted['pages']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
