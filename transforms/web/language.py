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
                          "(or lingua-language-detector), or set languages=any") from None
    return lingua


@functools.lru_cache(maxsize=4)
def detector(candidates: tuple[str, ...]):
    """One lingua detector per worker process and candidate set (its models load lazily, per language)."""
    lingua = _lingua()
    languages = [lingua.Language.from_iso_code_639_1(getattr(lingua.IsoCode639_1, c.upper())) for c in candidates]
    return lingua.LanguageDetectorBuilder.from_languages(*languages).build()


_NOT_WORDS = re.compile(r"https?://\S+|[\w.+-]+@[\w.-]+|\d+")


def detect(text: str, wanted: frozenset[str] = frozenset()) -> Optional[str]:
    """The ISO 639-1 code of the language of `text` (its first MAX_CHARS characters), or None when the
    text has no letters to judge (no evidence either way: the caller keeps the page)."""
    sample = _NOT_WORDS.sub(" ", text[:MAX_CHARS])
    if not any(ch.isalpha() for ch in sample):
        return None
    candidates = tuple(sorted(set(CANDIDATES) | set(wanted)))
    found = detector(candidates).detect_language_of(sample)
    return found.iso_code_639_1.name.lower() if found is not None else None


def language_reason(text: str, wanted: Optional[frozenset[str]]) -> Optional[str]:
    """'language: zh (not in en)' when the text is in a language not wanted; None to keep it."""
    if wanted is None:
        return None
    found = detect(text, wanted)
    if found is None or found in wanted:
        return None
    return f"language: {found} (not in {','.join(sorted(wanted))})"
