"""Curation in the languages a crawl keeps, measured on sets written blind to the rules.

Twenty-nine sets, each written by helpers who had read neither the rules nor the sets before it, in zh,
ja, ru, de, es, fr, pt, it, pl, nl, tr, vi, id, ko, ar and en (the seventh: cs for en) (good pages
with hard negatives, adult, gambling and lottery, error and parked pages):
tests/data/curation_multilingual/ (112 pages), curation_multilingual2/ (96),
curation_multilingual3/ to 29/ (128 each, with two hard negatives and two gambling pages a
language; the seventh's to fifteenth's error and parked pages as long as real sites make them, half
over 800 characters). Measured with languages=any, so no page is dropped for its
language: a harm or error judgement must come from the rules themselves. Each page is an HTML-only
row (curation's fallback), a page served with status >= 400 a drop (as the renderer's RenderError is),
a page dropped as too_little_text a keep: min_text_chars is a setting of how much a page holds, not
a judgement, and must not count for the rules either way (since 2026-12-07; the table's figures
before that date counted it as a drop).

The first five (and the English sets) are what curation's topic head (transforms/web/topic_head.py)
is fitted on; the sixth to eleventh are not in the fit, but chose how the head's kinds also judge
longer pages (KIND_PAGE_CHARS, topic_model.KIND_SURE, the title and headings) and the phrases of
content that is gone; the twelfth to twenty-fifth were tuned on (their misses named; the
nineteenth's figures only); the twenty-sixth to twenty-ninth are held out from everything.
Precision / recall of "drop", 2026-12-06 and after, with the head's five classes (error and parked
beside the topics):

    set                       words alone   head, its set left out of the fit   head
    curation_multilingual     0.96 / 0.86   0.98 / 1.00                          1.00 / 1.00
    curation_multilingual2    0.95 / 0.81   0.97 / 1.00                          1.00 / 1.00
    curation_multilingual3    0.95 / 0.76   0.98 / 1.00                          1.00 / 1.00
    curation_multilingual4    0.95 / 0.66   0.99 / 0.98                          1.00 / 1.00
    curation_multilingual5    0.93 / 0.64   0.99 / 0.94                          1.00 / 0.99
    curation_multilingual6    0.94 / 0.61                                        0.99 / 0.95  (tuned on)
    curation_multilingual7    0.87 / 0.62                                        0.97 / 0.95  (tuned on)
    curation_multilingual8                                                       1.00 / 1.00  (tuned on)
    curation_multilingual9                                                       0.96 / 1.00  (tuned on)
    curation_multilingual10                                                      1.00 / 1.00  (tuned on)
    curation_multilingual11                                                      0.98 / 0.97  (tuned on)
    curation_multilingual12                                                      0.98 / 0.97  (tuned on)
    curation_multilingual13                                                      0.98 / 0.98  (tuned on)
    curation_multilingual14                                                      0.95 / 0.98  (tuned on)
    curation_multilingual15                                                      0.97 / 1.00  (tuned on, 2026-12-07)
    curation_multilingual16                                                      0.98 / 1.00  (tuned on, 2026-12-07)
    curation_multilingual17                                                      0.94 / 0.95  (tuned on, 2026-12-07)
    curation_multilingual18                                                      0.85 / 0.97  (tuned on, 2026-12-07)
    curation_multilingual19                                                      0.89 / 0.97  (held out then)
    curation_multilingual20                                                      0.86 / 0.97  (tuned on)
    curation_multilingual21                                                      0.86 / 0.97  (held out, then tuned on)
    curation_multilingual22                                                      0.98 / 0.95  (tuned on; new measure)
    curation_multilingual23                                                      0.91 / 0.95  (held out, then tuned on)
    curation_multilingual24                                                      0.93 / 1.00  (held out, then tuned on)
    curation_multilingual25                                                      0.97 / 0.98  (held out, then tuned on)
    curation_multilingual26                                                      0.98 / 0.97  (held out)
    curation_multilingual27                                                      0.97 / 1.00  (held out)
    curation_multilingual28                                                      0.98 / 1.00  (held out)
    curation_multilingual29                                                      1.00 / 0.95  (held out)

The sixth scored 0.96 / 0.84 before the kinds judged longer pages; the seventh, scored blind once
before that change and once after, 0.92 / 0.84 then 0.92 / 0.89; the eighth, scored blind on that
code, 0.98 / 0.83 (11 of its 16 long error and parked pages kept: the first 1,000 characters the
head reads were mostly the site's menus). Judging a long page's kind also by its title and headings,
at 0.93 instead of 0.95, was chosen on the sixth to eighth (7 drops more found, none more dropped,
none of 1,590 pages of Python's documentation): 0.92 / 0.92 and 0.98 / 0.91. The ninth, written
blind after it and scored once: 0.93 / 0.88 (with the code before it 0.95 / 0.86: one Arabic
parked page more found, a registrar's about page more dropped). The title alone and the first
heading alone, judged at the same 0.93, were then chosen on the first nine (4 drops more, none
more dropped). The tenth, written blind after both and scored once: 0.97 / 0.91 (0.97 / 0.88 with
the code of the morning, before either: 2 drops more found, none more dropped). The floor test
keeps each set from getting worse than the last column; the target test is the one
docs/papers/multiui.md sets: every language group at precision >= 0.95 and recall >= 0.90 on the
held-out set (strict xfail while it is not met). The eleventh, written blind after the tenth was
scored and scored once on that code: 0.93 / 0.86 (its misses again mostly long soft 404s; its false
drops articles about error codes, which the title and heading phrasings drop before the head is
asked). A head fitted also on the sixth to tenth and on every page's title and first heading, judged
leaving each of those five out of its fit, found more (recall 0.91 -> 0.95 on average, precision
0.95 either way) and scored 0.94 / 0.91 on the eleventh, but lost pages of the sets it was fitted on
(2, 4, 5, 10) and two unit cases, so it was not kept, and the eleventh has now been seen by it. Tune
on the first ten. Then two rules, chosen on the first ten: a title or heading that says 404 or not
found drops no page written as an article (three paragraphs of 140 characters), and one that says
its content is gone (removed, expired, deleted, no longer available, 16 languages) drops a page as
"not found" does. The twelfth, written blind after them, scored once before and once after: 0.95 /
0.91 then 0.95 / 0.92 (a Russian soft 404 more found, none more dropped). Then phrases for domains
for sale, registered or expired in more languages (not where quoted), link farms on a domain that
names itself, lottery picks, and Indonesian news words, chosen on the first eleven with the twelfth's
misses named: the twelfth 0.95 / 0.95 after. The thirteenth, written blind after them and scored
once before (0.89 / 0.89) and once after (0.89 / 0.91: a Turkish link farm more found): its false
drops are mostly pages about error codes. The fourteenth, written blind after that and scored once
on that code: 0.91 / 0.95 (its misses then read, so it is tuned on). Then, chosen on the first
fourteen: a title and headings that name two HTTP errors or more (a guide to them, a status page) and
a title that starts "error codes" make no error page; a long page whose title or a heading names its
own domain is judged parked as a short page is; an offer's word in quotation marks is reported, not
made. The first fourteen: 22 pages more right, none more wrong (the thirteenth 0.89 / 0.91 -> 0.95
/ 0.95, the fourteenth 0.91 / 0.95 -> 0.95 / 0.98). The fifteenth, written blind after the
fourteenth and scored once on the code before these rules and once after, only its figures read:
0.90 / 0.95 then 0.91 / 0.97. A change claimed on the fifteenth needs a sixteenth.
The eighteenth, written blind with hard negatives asked to share the drops' words, scored once on
the code of 2026-12-07's morning: 0.80 / 0.92 (5 of its 15 false drops sign-in and login pages
under min_text_chars). Then, chosen on the first eighteen with the eighteenth's misses read: a title
or heading that says how to fix an error ("cómo solucionar", "怎么解决", "после обновления PHP") is
about it; an error heading that apologizes ("Rất tiếc, trang ... không tồn tại") makes an error page
even inside a news site's article-like chrome; an adult word seconds the head at 0.5; a short
Vietnamese or Indonesian page is not judged by its margin over the English descriptions: 14 pages
more right, none more wrong, the same verdicts on 2,411 documentation pages. The nineteenth, written
blind after the eighteenth was read, scored once on the code before these rules and once after, only
its figures read: 0.89 / 0.97 both times. The twentieth and twenty-first, written blind beside each
other after that, scored 0.86 / 0.97 each on that code; then the measure above, the error and parked
rules asked before min_text_chars, and two rules chosen on the first twenty with the twentieth's
misses read (a page of 800 characters or more is parked by the head only where it names its own host
at its top; a link farm's "sponsored links"): sets 1 to 20 on the new measure 14 pages more right,
none more wrong (the twentieth 0.92 / 0.95 -> 0.97 / 0.97); the twenty-first, figures only, 0.93 /
0.97 before them and 0.95 / 0.97 after (docs/papers/multiui.md). The twenty-second and twenty-third,
written blind beside each other after that, scored once on that code (new measure): 0.98 / 0.95 and
0.91 / 0.95. Then, with the twenty-first's and twenty-second's misses read, five rules chosen on the
first twenty-two (a title or heading that is only a maintenance notice is an error page at any
length; a short page with a form of two fields or more, or with a price list, is not an error or a
placeholder by the model; a link farm's "related links"; Vietnamese lottery predictions): 11 pages
more right, none more wrong; the twenty-third, scored once after them: 0.98 / 0.97. The twenty-fourth
and twenty-fifth, written blind after that (Vietnamese and Indonesian pages asked to be true to
their sites), scored once on the same code: 0.93 / 1.00 and 0.97 / 0.98; the three held-out sets
together (384 pages): 0.96 / 0.98, every group at the target but English precision (0.92, one false
drop of thirteen). Then the twenty-third's misses were read and two Vietnamese and Indonesian word
sets chosen on the first twenty-three (an adult site's age gate; lottery results' abbreviations):
4 pages more right, none more wrong; the twenty-fourth and twenty-fifth, scored again: the same.
Then, with the twenty-fourth's and twenty-fifth's misses read (2026-12-07, afternoon), six rules
chosen on the first twenty-five: a short page that shows two prices or more is an error page for
the model only where it is sure (KIND_SURE), as a longer one is; an appliance's fault codes, making
a 404 page and a problem after deploying are about errors, also on a short page; a placeholder's
words in quotation marks are reported; a Korean "post not found"; a head's offer term that the body
also says (within "pornographic") names the page's subject: 10 pages more right (two of them on the
nineteenth), none more wrong, the same verdicts on 2,411 documentation pages. The twenty-sixth and
twenty-seventh, written blind beside each other while those rules were chosen, scored once on the
code before them (0.98 / 0.97 and 0.97 / 1.00) and once after: the same verdicts, every page.
Pooled: 0.98 / 0.98, every group at the target (CJK 0.96 / 1.00, Latin European 0.97 / 0.97, the
others 1.00 / 1.00). The twenty-eighth and twenty-ninth, written blind beside each other after that
(the same brief), scored once on the code before those rules and once after: the same verdicts,
0.98 / 1.00 and 1.00 / 0.95. The four held out together (512 pages), the target test's measure:
0.98 / 0.98; CJK 0.98 / 0.98, Latin European 0.98 / 0.97, Arabic, Cyrillic, English and Southeast
Asian 1.00 / 1.00.
"""
from __future__ import annotations

import collections
import functools

import pytest

from tests import curation_sets as S
from transforms.web import topic_model

# each set's floor, as last measured (the docstring's table): (precision, drops found of drops)
FLOORS = {"curation_multilingual": (64 / 64, 64 / 64), "curation_multilingual2": (64 / 64, 64 / 64),
          "curation_multilingual3": (80 / 80, 80 / 80), "curation_multilingual4": (80 / 80, 80 / 80),
          "curation_multilingual5": (79 / 79, 79 / 80), "curation_multilingual6": (77 / 78, 77 / 80),
          "curation_multilingual7": (60 / 62, 60 / 64), "curation_multilingual8": (64 / 64, 64 / 64),
          "curation_multilingual9": (64 / 66, 64 / 64), "curation_multilingual10": (63 / 63, 63 / 64),
          "curation_multilingual11": (62 / 63, 62 / 64), "curation_multilingual12": (62 / 62, 62 / 64),
          "curation_multilingual13": (62 / 62, 62 / 64), "curation_multilingual14": (63 / 65, 63 / 64),
          "curation_multilingual15": (64 / 64, 64 / 64), "curation_multilingual16": (64 / 65, 64 / 64),
          "curation_multilingual17": (61 / 63, 61 / 64), "curation_multilingual18": (62 / 64, 62 / 64),
          "curation_multilingual19": (63 / 64, 63 / 64), "curation_multilingual20": (63 / 64, 63 / 64),
          "curation_multilingual21": (64 / 64, 64 / 64), "curation_multilingual22": (63 / 63, 63 / 64),
          "curation_multilingual23": (64 / 65, 64 / 64), "curation_multilingual24": (64 / 64, 64 / 64),
          "curation_multilingual25": (64 / 64, 64 / 64), "curation_multilingual26": (62 / 63, 62 / 64),
          "curation_multilingual27": (64 / 66, 64 / 64), "curation_multilingual28": (64 / 65, 64 / 64),
          "curation_multilingual29": (61 / 61, 61 / 64)}
# the target is met on them together
HELD_OUT = ("curation_multilingual26", "curation_multilingual27", "curation_multilingual28", "curation_multilingual29")
# not in the fit, and tuned on
TUNED_ON = ("curation_multilingual6", "curation_multilingual7", "curation_multilingual8",
            "curation_multilingual9", "curation_multilingual10", "curation_multilingual11",
            "curation_multilingual12", "curation_multilingual13", "curation_multilingual14",
            "curation_multilingual15", "curation_multilingual16", "curation_multilingual17",
            "curation_multilingual18", "curation_multilingual19", "curation_multilingual20",
            "curation_multilingual21", "curation_multilingual22", "curation_multilingual23",
            "curation_multilingual24", "curation_multilingual25")
GROUPS = {"cjk": ("zh", "ja", "ko"), "cyrillic": ("ru",),
          "latin_europe": ("de", "es", "fr", "pt", "it", "pl", "nl", "tr", "cs"),
          "southeast_asia": ("vi", "id"), "arabic": ("ar",), "english": ("en",)}


# the fast tier measures the held-out sets together (the target); the full run every set's floor
TIERS = {name: pytest.mark.slow for name in FLOORS}


@functools.lru_cache(maxsize=None)
def judged(name: str) -> tuple:
    """(label, dropped) of each page of a set, judged once per process: the full run's floors and the
    pooled target share them."""
    rules = S.rules(None)
    out = []
    for lab in S.labels(name):
        row = S.html_row(lab) if lab["status"] < 400 else f"HTTP {lab['status']}"
        out.append((lab, S.reason(row, rules) not in (None, "too_little_text")))
    return tuple(out)


@pytest.fixture(scope="module", params=[pytest.param(n, marks=TIERS.get(n, [])) for n in sorted(FLOORS)])
def measured(request):
    """{group: (precision, recall)} of 'drop' and the pages judged wrong, printed as a table; the set
    (or the sets, a tuple of names, pooled)."""
    counts = collections.defaultdict(lambda: [0, 0, 0])     # tp, fp, fn
    wrong = []
    group_of = {lang: group for group, langs in GROUPS.items() for lang in langs}
    names = request.param if isinstance(request.param, tuple) else (request.param,)
    for lab, dropped in (page for name in names for page in judged(name)):
        want = lab["label"] == "drop"
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
                                                ("curation_multilingual3", 8), ("curation_multilingual4", 8),
                                                ("curation_multilingual5", 8), ("curation_multilingual6", 8),
                                                ("curation_multilingual7", 8), ("curation_multilingual8", 8),
                                                ("curation_multilingual9", 8), ("curation_multilingual10", 8),
                                                ("curation_multilingual11", 8), ("curation_multilingual12", 8),
                                                ("curation_multilingual13", 8), ("curation_multilingual14", 8),
                                                ("curation_multilingual15", 8), ("curation_multilingual16", 8),
                                                ("curation_multilingual17", 8), ("curation_multilingual18", 8),
                                                ("curation_multilingual19", 8), ("curation_multilingual20", 8),
                                                ("curation_multilingual21", 8), ("curation_multilingual22", 8),
                                                ("curation_multilingual23", 8), ("curation_multilingual24", 8),
                                                ("curation_multilingual25", 8), ("curation_multilingual26", 8),
                                                ("curation_multilingual27", 8), ("curation_multilingual28", 8),
                                                ("curation_multilingual29", 8)])
def test_every_language_is_measured(name, per_language):
    labs = S.labels(name)
    absent = "en" if name == "curation_multilingual7" else "cs"      # the seventh has Czech for English
    assert collections.Counter(lab["language"] for lab in labs) == {lang: per_language for langs in GROUPS.values()
                                                                    for lang in langs if lang != absent}
    assert {lab["category"] for lab in labs} == {"good", "adult", "gambling", "error", "parked"}


def test_multilingual_floor(measured):
    """No worse than last measured (FLOORS)."""
    scores, wrong, name = measured
    precision, recall = scores["all"]
    floor_precision, floor_recall = FLOORS[name]
    assert precision >= floor_precision and recall >= floor_recall, wrong


@pytest.mark.parametrize("measured", [HELD_OUT], indirect=True)
def test_every_language_group_meets_the_target(measured):
    scores, wrong, _ = measured
    below = {k: v for k, v in scores.items() if v[0] < 0.95 or v[1] < 0.90}
    assert not below, (below, wrong)


def test_the_held_out_set_is_not_in_the_heads_fit():
    held_out = set(HELD_OUT)
    assert not held_out & set(topic_model.TRAINING_SETS) and not set(TUNED_ON) & set(topic_model.TRAINING_SETS)
    assert not held_out & set(TUNED_ON)
    assert set(FLOORS) - held_out - set(TUNED_ON) <= set(topic_model.TRAINING_SETS)
