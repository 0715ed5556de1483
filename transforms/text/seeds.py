"""Self-MoE seed sets: a few hand-written examples per expert domain, read from JSON Lines.

Each line is one object ``{"instruction": str, "input": str (may be ""), "output": str}``.
The base model is shown a few seeds as demonstrations when it brainstorms new instructions
and when it answers them, so a bad seed poisons everything downstream: every malformed line
becomes a :class:`Rejected` naming the file and the 1-based line number, while the rest of the
file is still read.  Blank lines are skipped; a seed that repeats an earlier one (same id) is
rejected as a duplicate of that line.

The packaged defaults live in ``pipelines/seeds/selfmoe/<domain>.jsonl`` (package data of the
``pipelines`` package).
"""
from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Iterator
from importlib import resources
from typing import Any, Union

from core import storage
from transforms.io.ids import stable_id
from core.rejected import Rejected

DOMAINS = ("knowledge", "reasoning", "math", "coding")
ID_NAMESPACE = "selfmoe-seed"
MAX_LINE_CHARS = 8000
EXCERPT_CHARS = 200
FIELDS = ("instruction", "input", "output")
REQUIRED_NONEMPTY = ("instruction", "output")
_PACKAGE = "pipelines"
_SEED_DIR = ("seeds", "selfmoe")

Source = Union[str, "os.PathLike[str]", Iterable[str]]


class EmptyDomain(ValueError):
    """A seed file that yields no usable seed: a domain needs at least one to show the model."""


def seed_id(domain: str, instruction: str, input: str, output: str) -> str:
    """Stable id of a seed: equal seeds get equal ids on every machine and run."""
    return stable_id(ID_NAMESPACE, domain, instruction, input, output)


def _excerpt(text: str) -> str:
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "..."


def _lines(source: Source) -> tuple[str, Iterator[tuple[int, Union[str, bytes]]]]:
    """The source's name for messages and its numbered raw lines (1-based)."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)

        def from_file() -> Iterator[tuple[int, bytes]]:
            # Bytes, decoded per line: one undecodable line is one rejection, not a crash.
            # A local path or a store URL: the file is streamed, never held whole.
            with io.BufferedReader(storage.open_stream(path)) as f:
                yield from enumerate(f, start=1)

        return path, from_file()
    if isinstance(source, bytes):
        raise TypeError("read_seeds takes a path or an iterable of text lines, not bytes")
    return "<lines>", enumerate(source, start=1)


def _problem(row: Any) -> str | None:
    """What is wrong with a parsed line, or None if it is a good seed."""
    if not isinstance(row, dict):
        return f"expected a JSON object, got {type(row).__name__ if row is not None else 'null'}"
    for key in FIELDS:
        if key not in row:
            if key == "input":
                continue
            return f"missing field {key!r}"
        value = row[key]
        if not isinstance(value, str):
            kind = "null" if value is None else type(value).__name__
            return f"field {key!r} must be a string, got {kind}"
    for key in REQUIRED_NONEMPTY:
        if not row[key].strip():
            return f"field {key!r} is empty"
    return None


def _parse_line(n: int, raw) -> tuple[dict | None, str | None, str]:
    """(row, problem, text) of line n: a seed's JSON object, or what is wrong with the line; neither
    for a blank line."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            return None, f"not valid UTF-8 ({e.reason} at byte {e.start})", raw.decode("utf-8", "replace")
    elif isinstance(raw, str):
        text = raw
    else:
        return None, f"expected a line of text, got {type(raw).__name__}", repr(raw)
    if n == 1:
        text = text.lstrip("\ufeff")  # a byte-order mark some editors write
    text = text.rstrip("\r\n")
    if not text.strip():
        return None, None, text
    if len(text) > MAX_LINE_CHARS:
        return None, f"line is {len(text)} characters, over the limit of {MAX_LINE_CHARS}", text
    try:
        row = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"not valid JSON ({e.msg} at column {e.colno})", text
    except RecursionError:
        return None, "not valid JSON (nested too deeply)", text
    return row, _problem(row), text


def read_seeds(source: Source, domain: str, *, name: str | None = None
               ) -> Iterator[Union[dict, Rejected]]:
    """Seeds of one domain from a JSON Lines file (a path) or from an iterable of text lines.

    Yields, in file order, one dict per good line::

        {"id", "domain", "instruction", "input", "output", "line"}

    (``input`` defaults to "" when absent; ``line`` is 1-based) and one :class:`Rejected` per
    bad line, whose reason starts with ``"<file>:<line>: "``.  Blank lines are skipped.
    ``name`` overrides the file name used in messages (handy for lines held in memory).
    """
    if not isinstance(domain, str) or not domain.strip():
        raise ValueError(f"domain must be a non-empty string, got {domain!r}")
    source_name, numbered = _lines(source)
    if name is not None:
        source_name = name
    first_line: dict[str, int] = {}

    def reject(n: int, what: str, text: str, error_type: str = "MalformedSeed") -> Rejected:
        return Rejected(f"{source_name}:{n}: {what}", _excerpt(text), error_type)

    for n, raw in numbered:
        row, problem, text = _parse_line(n, raw)
        if problem is not None:
            yield reject(n, problem, text)
            continue
        if row is None:             # a blank line
            continue
        instruction, input_, output = row["instruction"], row.get("input", ""), row["output"]
        sid = seed_id(domain, instruction, input_, output)
        if sid in first_line:
            yield reject(n, f"duplicate of the seed on line {first_line[sid]}", text,
                         "DuplicateSeed")
            continue
        first_line[sid] = n
        yield {"id": sid, "domain": domain, "instruction": instruction, "input": input_,
               "output": output, "line": n}


def _seed_dir():
    return resources.files(_PACKAGE).joinpath(*_SEED_DIR)


def default_domains() -> list[str]:
    """Domains that have a packaged default seed file, sorted."""
    d = _seed_dir()
    if not d.is_dir():
        return []
    return sorted(p.name[: -len(".jsonl")] for p in d.iterdir()
                  if p.name.endswith(".jsonl") and p.is_file())


def default_seed_path(domain: str) -> str:
    """Path of the packaged seed file of a domain; ValueError listing the known ones if none."""
    if isinstance(domain, str) and domain and "/" not in domain and "\\" not in domain:
        candidate = _seed_dir().joinpath(f"{domain}.jsonl")
        if candidate.is_file():
            return os.fspath(candidate)
    known = default_domains()
    raise ValueError(f"no default Self-MoE seed file for domain {domain!r}; domains with "
                     f"defaults: {', '.join(known) if known else '(none found)'}; "
                     "pass a seed file path for other domains")


def require_seeds(seeds: list[dict], source_name: str, domain: str, n_rejected: int = 0) -> None:
    """Raise EmptyDomain when a seed file gave no usable seed."""
    if not seeds:
        detail = f" ({n_rejected} line(s) rejected)" if n_rejected else ""
        raise EmptyDomain(f"{source_name}: no usable seeds for domain {domain!r}{detail}; "
                          "each domain needs at least one seed")


def load_seeds(domain: str, path: Source | None = None) -> tuple[list[dict], list[Rejected]]:
    """All seeds of a domain (the packaged file unless `path` is given) and the rejected lines.

    Raises EmptyDomain (a ValueError) when no line gives a usable seed.
    """
    source = default_seed_path(domain) if path is None else path
    seeds: list[dict] = []
    rejected: list[Rejected] = []
    for item in read_seeds(source, domain):
        (rejected if isinstance(item, Rejected) else seeds).append(item)
    name = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "<lines>"
    require_seeds(seeds, name, domain, len(rejected))
    return seeds, rejected
