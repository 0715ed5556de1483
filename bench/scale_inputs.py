"""Inputs of any size for bench/scale.py, made from the samples bundled with the repository.

The mix is the same at every scale: a page (a problem) i is made from template i mod T of a fixed
cycle of T templates, and the sizes are multiples of T, so 16x has exactly sixteen times 1x's
pages of each kind and the cost per unit compares like with like.
"""
from __future__ import annotations

import json
import os
import re
import shutil

from repo_path import ROOT  # noqa: E402  (the repository root on sys.path)
SITE = os.path.join(ROOT, "pipelines", "sites", "multiui")
PROBLEMS = os.path.join(ROOT, "pipelines", "samples", "lean", "minif2f_sample.jsonl")
PAGE_TEMPLATES = ("shop.html", "blog.html", "stores.html")   # a shop, an article, a listing
PROBLEM_TEMPLATES = 4                                        # the first four bundled miniF2F problems


def make_site(folder: str, pages: int) -> str:
    """`pages` HTML pages p00000.html ... in `folder` (with the sample site's CSS and images): page i
    is template i mod 3 with its own title and heading, and its links lead to other pages of
    the folder, so following links works at every size."""
    os.makedirs(folder, exist_ok=True)
    shutil.copy(os.path.join(SITE, "style.css"), folder)
    shutil.copytree(os.path.join(SITE, "img"), os.path.join(folder, "img"), dirs_exist_ok=True)
    names = sorted(n for n in os.listdir(SITE) if n.endswith(".html"))
    templates = {}
    for name in PAGE_TEMPLATES:
        with open(os.path.join(SITE, name), encoding="utf-8") as fh:
            templates[name] = fh.read()
    for i in range(pages):
        html = templates[PAGE_TEMPLATES[i % len(PAGE_TEMPLATES)]]

        def link(match, i=i):
            target = match.group(1)
            step = names.index(target) + 1 if target in names else 1
            return f'href="p{(i + step) % pages:05d}.html"'
        html = re.sub(r'href="([\w-]+\.html)"', link, html)
        html = re.sub(r"<title>(.*?)</title>", rf"<title>\1 (no. {i})</title>", html, count=1)
        html = re.sub(r"<h1>(.*?)</h1>", rf"<h1>\1, edition {i}</h1>", html, count=1)
        with open(os.path.join(folder, f"p{i:05d}.html"), "w", encoding="utf-8") as fh:
            fh.write(html)
    return folder


def make_problems(path: str, count: int) -> str:
    """`count` DeepSeek-style problems in one .jsonl: problem i is bundled problem i mod 4 under the
    name NAME_sI (its theorem renamed to match)."""
    with open(PROBLEMS, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()][:PROBLEM_TEMPLATES]
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(count):
            row = dict(rows[i % len(rows)])
            name = f"{row['name']}_s{i}"
            row["formal_statement"] = row["formal_statement"].replace(f"theorem {row['name']}", f"theorem {name}", 1)
            row["name"] = name
            fh.write(json.dumps(row) + "\n")
    return path
