"""Which language a page is written in, so curation can keep the languages a run asks for.

MultiUI's pages came from FineWeb, an English crawl; a raw Common Crawl excerpt is not, and a
keyword rule in one language cannot judge a page in another. Detection uses lingua
(lingua-language-detector), whose n-gram models ship inside its wheel: nothing is downloaded at run
time. The detector is built once per worker process, on first use, and only for a candidate set of
common web languages plus the ones asked for: the answer only has to say "one of the wanted
languages or not", and a smaller set is faster and needs less memory than all 75 languages.
"""
from __future__ import annotations

import functools
import re
from typing import Optional

# The most common languages of Common Crawl pages (plus a few close relatives of them, so that, say,
# Catalan is not forced into Spanish); a page in a language outside this set is reported as its
# nearest candidate, which is still "not wanted" unless that candidate is wanted.
CANDIDATES = ("en", "zh", "es", "de", "fr", "ja", "ru", "pt", "it", "ko", "ar", "nl", "pl", "tr", "vi", "id",
              "ms", "fa", "uk", "sv", "nb", "da", "fi", "cs", "sk", "hu", "ro", "el", "he", "hi", "bn", "th",
              "ca", "bg", "hr", "sr", "lt", "lv", "et", "sl", "tl", "ur")
# Detection reads at most this many characters of the page's text: a few sentences settle the
# language, and lingua's cost grows with the text (docs/papers/multiui.md gives the measured cost).
MAX_CHARS = 2000
ANY = "any"

# Scripts that do not put spaces between words (or glue particles to them): Thai, Arabic, Chinese,
# Japanese, Korean. Their terms are matched as substrings, and a Chinese, Japanese or Korean
# character carries about a word's worth of text (three letters of a spaced script).
DENSE_CHAR = re.compile(r"[\u0e00-\u0e7f\u0600-\u06ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
CJK_CHAR = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


def wanted_languages(spec: str) -> Optional[frozenset[str]]:
    """The ISO 639-1 codes of a `languages` setting ("en", "en,de", "any"); None means any language."""
    codes = [c.strip().lower() for c in (spec or "").split(",") if c.strip()]
    if not codes:
        raise ValueError("languages: name ISO 639-1 codes (e.g. en or en,de,fr) or 'any'")
    if ANY in codes:
        return None
    known = supported()
    unknown = [c for c in codes if c not in known]
    if unknown:
        raise ValueError(f"languages: {', '.join(unknown)} not known to the language detector; use ISO 639-1 "
                         f"codes from: {', '.join(sorted(known))}; or 'any' to keep every language")
    return frozenset(codes)


@functools.lru_cache(maxsize=1)
def supported() -> frozenset[str]:
    """The ISO 639-1 codes lingua can detect."""
    return frozenset(lang.iso_code_639_1.name.lower() for lang in _lingua().Language.all())


def _lingua():
    try:
        import lingua
    except ImportError:
        raise ImportError("language detection needs lingua: pip install 'shardsmith[web]' "
                          "(or lingua-language-detector); curation holds each page's title against its "
                          "text whatever `languages` says") from None
    return lingua


@functools.lru_cache(maxsize=4)
def detector(candidates: tuple[str, ...]):
    """One lingua detector per worker process and candidate set, in lingua's low-accuracy mode (trigram
    models only). In its default mode lingua loads every n-gram order of each candidate language of
    the text's script the first time a text has fewer than about 120 letters (a title, a short page):
    a worker's memory stepped up by 630 MB (6.5 CPU-s) at its first short Latin-script text, up to
    900 MB for every script. With trigrams alone a process holds about 45 MB; curation's verdicts
    on the four labelled page sets (182 pages, 30 of the texts short, with `languages` en and any)
    are the same in both modes (docs/benchmarks.md, scale.py)."""
    lingua = _lingua()
    languages = [lingua.Language.from_iso_code_639_1(getattr(lingua.IsoCode639_1, c.upper())) for c in candidates]
    return lingua.LanguageDetectorBuilder.from_languages(*languages).with_low_accuracy_mode().build()


_NOT_WORDS = re.compile(r"https?://\S+|[\w.+-]+@[\w.-]+|\d+")


def _sample(text: str) -> Optional[str]:
    """The first MAX_CHARS characters without URLs, addresses and numbers; None when no letter is left."""
    sample = _NOT_WORDS.sub(" ", text[:MAX_CHARS])
    return sample if any(ch.isalpha() for ch in sample) else None


def _detector(wanted: frozenset[str]):
    return detector(tuple(sorted(set(CANDIDATES) | set(wanted))))


def detect(text: str, wanted: frozenset[str] = frozenset()) -> Optional[str]:
    """The ISO 639-1 code of the language of `text` (its first MAX_CHARS characters), or None when the
    text has no letters to judge (no evidence either way: the caller keeps the page)."""
    sample = _sample(text)
    return _detected(sample, wanted) if sample else None


@functools.lru_cache(maxsize=8)
def _detected(sample: str, wanted: frozenset[str]) -> Optional[str]:
    # cached: a page's second platform usually has the first's text (lingua: about 8 ms a page)
    found = _detector(wanted).detect_language_of(sample)
    return found.iso_code_639_1.name.lower() if found is not None else None


def confidences(text: str, wanted: frozenset[str] = frozenset()) -> dict[str, float]:
    """lingua's confidence, per candidate language, that `text` is in it (0 to 1, summing to 1): how
    sure it is, where a short text leaves room for doubt. Empty when the text has no letters."""
    sample = _sample(text)
    values = _detector(wanted).compute_language_confidence_values(sample) if sample else ()
    return {v.language.iso_code_639_1.name.lower(): v.value for v in values}


def language_reason(found: Optional[str], wanted: Optional[frozenset[str]]) -> Optional[str]:
    """'language: zh (not in en)' when the detected language `found` is not wanted; None to keep the page."""
    if wanted is None or found is None or found in wanted:
        return None
    return f"language: {found} (not in {','.join(sorted(wanted))})"
