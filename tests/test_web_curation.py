"""Curation rules and the LLM judge's verdict parsing on hand-built pages."""
import pytest

from transforms.llm.requests import Completion, Sampling
from transforms.web import curation

ARTICLE = ("The river town keeps its old market hall, where farmers sell apples, cheese and bread every "
           "Saturday morning. The hall was rebuilt in 1887 after a fire and now hosts concerts in winter. "
           "Visitors can walk along the towpath to the lock keeper's cottage, which is open on weekends.")


def _page(title="Market hall", text=ARTICLE, extra=()):
    nodes = [{"name": text, "role": "paragraph"}] + [{"name": e, "role": "link"} for e in extra]
    return {"id": "p1", "title": title, "final_url": "http://example.test/", "nodes": nodes,
            "text_chars": sum(len(n["name"]) for n in nodes)}


def test_a_normal_page_is_kept():
    assert curation.rule_reason(_page()) is None


@pytest.mark.parametrize("title", ["404 Not Found", "Error", "Page not found", "Access Denied",
                                   "500 Internal Server Error", "Just a moment..."])
def test_error_pages(title):
    assert curation.rule_reason(_page(title=title)) == "error_page"


def test_parked_and_thin_pages():
    assert curation.rule_reason(_page(extra=["This domain is for sale! Buy this domain today"])) == "parked"
    assert curation.rule_reason(_page(text="Welcome")) == "too_little_text"
    assert curation.rule_reason(_page(text="Welcome"), min_text_chars=5) is None


@pytest.mark.parametrize("topic, words", [
    ("gambling", ["Casino bonus", "Free spins every day", "Play slots now", "Live roulette"]),
    ("adult", ["XXX videos", "NSFW gallery", "Camgirls online"]),
    ("violent", ["Gore clips", "Beheading footage: gore", "uncensored gore"]),
])
def test_keyword_topics_need_several_hits(topic, words):
    assert curation.rule_reason(_page(extra=words)) == topic
    assert curation.rule_reason(_page(extra=words[:1])) is None     # one mention is not a topic


def test_words_inside_other_words_do_not_count():
    assert curation.rule_reason(_page(extra=["Essex", "Sussex", "Middlesex", "casinoless", "slotsize"])) is None


def test_judge_request_and_verdicts():
    page = _page()
    request = curation.judge_request(page, "heading 'Market hall'", Sampling(max_tokens=4))
    assert request.is_chat and "Market hall" in request.prompt[1]["content"]
    assert request.id == curation.judge_request(page, "other text", Sampling()).id   # keyed by page
    verdict = lambda text: curation.judge_reason(Completion(request.id, text, "stop", 1, 1, "m", "transformers"))
    assert verdict("KEEP") == (None, None)
    assert verdict(" Gambling.") == ("gambling", None)
    assert verdict("error") == ("error_page", None)
    reason, problem = verdict("I think this page is lovely")
    assert reason is None and "not a label" in problem
