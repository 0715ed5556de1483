"""Self-MoE seed sets: the packaged files are clean and correct, and the reader survives bad lines."""
from __future__ import annotations

import json
import re

import pytest

from core.rejected import Rejected
from transforms.text import rouge_l_f, tokenize
from transforms.text.seeds import (DOMAINS, MAX_LINE_CHARS, EmptyDomain, default_domains,
                                   default_seed_path, load_seeds, read_seeds, seed_id)


def _split(items):
    seeds = [x for x in items if not isinstance(x, Rejected)]
    rejected = [x for x in items if isinstance(x, Rejected)]
    return seeds, rejected


def _line(obj) -> str:
    return json.dumps(obj)


GOOD = {"instruction": "Name the largest planet.", "input": "", "output": "Jupiter."}
GOOD2 = {"instruction": "What is 2 + 3?", "output": "2 + 3 = 5. The answer is 5."}


# --- the packaged seed files ---------------------------------------------------------------

@pytest.mark.parametrize("domain", DOMAINS)
def test_default_files_parse_clean(domain):
    path = default_seed_path(domain)
    assert path.endswith(f"{domain}.jsonl")
    seeds, rejected = load_seeds(domain)
    assert rejected == []
    assert len(seeds) >= 20
    assert [s["line"] for s in seeds] == list(range(1, len(seeds) + 1))
    for s in seeds:
        assert set(s) == {"id", "domain", "instruction", "input", "output", "line"}
        assert s["domain"] == domain
        assert s["instruction"].strip() and s["output"].strip()
        assert s["instruction"] == s["instruction"].strip()
    with open(path, encoding="utf-8") as f:
        for line in f:
            assert set(json.loads(line)) == {"instruction", "input", "output"}


def test_default_domains_listed():
    assert set(DOMAINS) <= set(default_domains())


@pytest.mark.parametrize("domain", DOMAINS)
def test_no_near_duplicates_within_domain(domain):
    seeds, _ = load_seeds(domain)
    for field in ("instruction", "task", "output"):
        def text(s):
            return (s["instruction"] + " " + s["input"]) if field == "task" else s[field]
        toks = [tokenize(text(s)) for s in seeds]
        for i in range(len(toks)):
            for j in range(i + 1, len(toks)):
                f = rouge_l_f(toks[i], toks[j])
                assert f < 0.7, (domain, field, seeds[i]["line"], seeds[j]["line"], f)


def test_ids_stable_and_distinct():
    for domain in DOMAINS:
        seeds, _ = load_seeds(domain)
        again, _ = load_seeds(domain)
        assert [s["id"] for s in seeds] == [s["id"] for s in again]
        assert len({s["id"] for s in seeds}) == len(seeds)
        for s in seeds:
            assert s["id"] == seed_id(domain, s["instruction"], s["input"], s["output"])
    # A fixed value: ids must not depend on the machine, the run or Python's hash seed.
    assert seed_id("math", "a", "", "b") == seed_id("math", "a", "", "b")
    assert seed_id("math", "a", "", "b") != seed_id("coding", "a", "", "b")
    assert seed_id("math", "a", "", "b") != seed_id("math", "a", "b", "")
    (row,) = list(read_seeds([_line(GOOD)], "knowledge"))
    from transforms.io.ids import stable_id
    assert row["id"] == stable_id("selfmoe-seed", "knowledge", GOOD["instruction"], "",
                                  GOOD["output"])
    assert len(row["id"]) == 20


# --- coding: every output is valid Python that passes these checks ---------------------------

def _check_coding(ns):
    checks = {
        "is_palindrome": lambda f: (f("A man, a plan, a canal: Panama") and not f("hello")
                                    and f("")),
        "fizzbuzz": lambda f: (f(15)[-1] == "FizzBuzz" and f(5) == ["1", "2", "Fizz", "4", "Buzz"]
                               and f(0) == []),
        "count_vowels": lambda f: f("Hello World") == 3 and f("xyz") == 0 and f("AEIOU") == 5,
        "second_largest": lambda f: f([3, 1, 4, 4, 2]) == 3 and f([5, 5]) is None and f([]) is None,
        "flatten": lambda f: f([1, [2, [3, [4]]], 5]) == [1, 2, 3, 4, 5] and f([]) == [],
        "is_prime": lambda f: ([n for n in range(30) if f(n)] == [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]
                               and not f(-7) and f(7919)),
        "word_counts": lambda f: f("the Cat and the hat") == {"the": 2, "cat": 1, "and": 1,
                                                              "hat": 1} and f("") == {},
        "gcd": lambda f: f(48, 18) == 6 and f(7, 0) == 7 and f(0, 9) == 9 and f(17, 5) == 1,
        "binary_search": lambda f: (f([1, 3, 5, 7, 9], 7) == 3 and f([1, 3, 5], 4) == -1
                                    and f([], 1) == -1 and f([2], 2) == 0),
        "reverse_words": lambda f: f("the quick  brown fox") == "fox brown quick the" and f("") == "",
        "merge_sorted": lambda f: f([1, 4, 6], [2, 3, 7, 8]) == [1, 2, 3, 4, 6, 7, 8] and f([], [1]) == [1],
        "fibonacci": lambda f: [f(i) for i in range(10)] == [0, 1, 1, 2, 3, 5, 8, 13, 21, 34],
        "are_anagrams": lambda f: f("Dormitory", "dirty room") and not f("abc", "abd"),
        "dedupe": lambda f: f([3, 1, 3, 2, 1]) == [3, 1, 2] and f([]) == [],
        "celsius_to_fahrenheit": lambda f: f(100) == 212 and f(0) == 32 and f(-40) == -40,
        "chunk": lambda f: f([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]] and f([], 3) == [],
        "is_balanced": lambda f: f("a(b[c]{d})") and not f("(]") and not f("((") and f(""),
        "digit_sum": lambda f: f(12345) == 15 and f(0) == 0 and f(909) == 18,
        "run_length_encode": lambda f: f("aaabcc") == "a3b1c2" and f("") == "" and f("z") == "z1",
        "transpose": lambda f: f([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]],
        "two_sum": lambda f: f([2, 7, 11, 15], 9) == (0, 1) and f([3, 3], 6) == (0, 1) and f([1, 2], 7) is None,
        "capitalize_words": lambda f: f("hello big world") == "Hello Big World" and f("a  b") == "A  B",
        "running_sum": lambda f: f([1, 2, 3]) == [1, 3, 6] and f([]) == [] and f([5, -5]) == [5, 0],
        "to_roman": lambda f: (f(1994) == "MCMXCIV" and f(3999) == "MMMCMXCIX" and f(4) == "IV"
                               and f(58) == "LVIII"),
    }
    defined = [name for name, v in ns.items() if callable(v) and not name.startswith("__")]
    checked = [name for name in defined if name in checks]
    assert checked, f"no known function among {defined}"
    for name in checked:
        assert checks[name](ns[name]), name
    return checked


def test_coding_outputs_exec_and_pass():
    seeds, _ = load_seeds("coding")
    seen = []
    for s in seeds:
        code = s["output"]
        compile(code, f"coding.jsonl:{s['line']}", "exec")
        ns: dict = {}
        exec(code, ns)  # noqa: S102 - our own seed file
        fns = [v for k, v in ns.items() if callable(v) and not k.startswith("__")]
        assert fns, s["line"]
        for fn in fns:
            assert fn.__doc__ and fn.__doc__.strip(), (s["line"], fn.__name__)
        seen += _check_coding(ns)
    assert len(seen) == len(seeds) == len(set(seen))


def test_coding_chunk_rejects_bad_size():
    seeds, _ = load_seeds("coding")
    (code,) = [s["output"] for s in seeds if s["output"].startswith("def chunk(")]
    ns: dict = {}
    exec(code, ns)  # noqa: S102
    with pytest.raises(ValueError):
        ns["chunk"]([1], 0)


# --- math: "The answer is N." matches an independent recomputation --------------------------

ANSWER_RE = re.compile(r"The answer is (-?\d+(?:\.\d+)?)\.$")

# Keyed by a phrase of the problem; values recomputed here, independently of the written steps.
MATH_EXPECTED = {
    "3 notebooks for $4": 3 * 4 + 2,
    "48 muffins": 48 // 6,
    "25 marbles": 25 - 7 + 12,
    "60 miles per hour": 60 * 3 + 40 * 2,
    "40% of them walk": 30 - 30 * 40 // 100,
    "$15 per hour": 15 * 6 * 5,
    "12 cm long and 5 cm wide": 2 * 12 + 2 * 5,
    "15 pages": 240 // 15,
    "$40 and is on sale for 25% off": 40 * 75 // 100,
    "4 shelves with 18 books": 4 * 18 + 2 * 25,
    "7 rows of tomato plants": 7 * 9 * 4,
    "3 times as old as her brother": 3 * 8 + 5,
    "500 liters": 500 * 60 // 100 // 20,
    "5 packs of stickers": 5 * 12 - 23 - 28,
    "9 buses": 9 * 45 - 12,
    "saves $8 every week": (100 - 36) // 8,
    "cut into 8 slices": 3 * 8 // 4,
    "125 apples": 125 + 2 * 125 + (2 * 125 - 60),
    "3 eggs for every 2 cups": 10 * 3 // 2,
    "$20 per month plus $0.10": 20 + 150 // 10,
    "bill of $84 and a tip of $18": (84 + 18) // 3,
    "18 kilometers each weekday": 5 * 18 + 2 * 35,
    "156 eggs": 156 // 12 * 3,
    "3 times as many stamps as Mia": next(m for m in range(1000) if 3 * m - 10 == m + 10),
}


def test_math_answers_recomputed():
    seeds, _ = load_seeds("math")
    matched = 0
    for s in seeds:
        m = ANSWER_RE.search(s["output"].strip())
        assert m, (s["line"], s["output"])
        keys = [k for k in MATH_EXPECTED if k in s["instruction"] + " " + s["input"]]
        assert len(keys) <= 1, keys
        if keys:
            assert float(m.group(1)) == MATH_EXPECTED[keys[0]], (s["line"], keys[0])
            matched += 1
    assert matched >= 8
    assert matched == len(MATH_EXPECTED)


def test_math_steps_are_arithmetically_correct():
    """Every 'a op b = c' written in the solutions holds (x is multiplication)."""
    seeds, _ = load_seeds("math")
    num = r"\d+(?:\.\d+)?"
    # Leftmost, greedy: a whole chain such as "125 + 250 + 190 = 565" is one match.
    step = re.compile(rf"(?<![\d.])((?:{num} [x/+-] )+{num}) = ({num})(?![\d])")
    n_steps = 0
    for s in seeds:
        for expr, result in step.findall(s["output"]):
            value = eval(expr.replace("x", "*"), {"__builtins__": {}})  # noqa: S307 - digits/ops only
            assert abs(value - float(result)) < 1e-9, (s["line"], expr, result)
            n_steps += 1
    assert n_steps >= 30


# --- the reader: bad lines are rejected with their line number, good lines survive ----------

def test_malformed_lines_rejected_with_line_numbers():
    huge = {"instruction": "x" * (MAX_LINE_CHARS + 10), "input": "", "output": "y"}
    lines = [
        _line(GOOD),                                            # 1 good
        '{"instruction": "oops", "output": ',                   # 2 bad JSON
        '["instruction", "output"]',                            # 3 array
        _line({"instruction": "no output here"}),               # 4 missing output
        "",                                                     # 5 blank: skipped
        _line({"instruction": "  ", "output": "x"}),            # 6 empty instruction
        _line({"instruction": "a", "input": 3, "output": "b"}),  # 7 non-string input
        _line(huge),                                            # 8 huge line
        _line(GOOD2),                                           # 9 good
        _line(GOOD),                                            # 10 duplicate of line 1
        "   \n",                                                # 11 blank: skipped
        _line({"instruction": "c", "output": ""}),              # 12 empty output
        "null",                                                 # 13 not an object
        _line({"instruction": "d", "input": None, "output": "e"}),  # 14 null input
        "[" * 5000,                                             # 15 nested too deep
    ]
    items = list(read_seeds(lines, "knowledge", name="k.jsonl"))
    seeds, rejected = _split(items)
    assert [s["line"] for s in seeds] == [1, 9]
    assert seeds[1]["input"] == ""  # absent input defaults to ""
    by_line = {int(r.reason.split(":")[1]): r for r in rejected}
    assert sorted(by_line) == [2, 3, 4, 6, 7, 8, 10, 12, 13, 14, 15]
    for n, r in by_line.items():
        assert r.reason.startswith(f"k.jsonl:{n}: ")
        assert len(r.excerpt) <= 210
    assert "not valid JSON" in by_line[2].reason
    assert "JSON object" in by_line[3].reason and "list" in by_line[3].reason
    assert "missing field 'output'" in by_line[4].reason
    assert "'instruction' is empty" in by_line[6].reason
    assert "'input' must be a string" in by_line[7].reason and "int" in by_line[7].reason
    assert "over the limit" in by_line[8].reason
    assert "duplicate of the seed on line 1" in by_line[10].reason
    assert by_line[10].error_type == "DuplicateSeed"
    assert by_line[2].error_type == "MalformedSeed"
    assert "'output' is empty" in by_line[12].reason
    assert "null" in by_line[13].reason
    assert "'input' must be a string, got null" in by_line[14].reason
    assert "nested too deeply" in by_line[15].reason
    # Order is file order.
    assert [x["line"] if isinstance(x, dict) else int(x.reason.split(":")[1]) for x in items] \
        == sorted([1, 9] + list(by_line))


def test_file_source_names_file_and_handles_bytes(tmp_path):
    p = tmp_path / "mine.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + _line(GOOD).encode() + b"\r\n"
                  + b'{"instruction": "bad \xff byte", "output": "x"}\n'
                  + b"\n"
                  + b"not json\n"
                  + _line(GOOD2).encode())  # no trailing newline
    seeds, rejected = _split(list(read_seeds(p, "math")))
    assert [s["line"] for s in seeds] == [1, 5]
    assert seeds[0]["instruction"] == GOOD["instruction"]
    assert [r.reason.split(": ")[0] for r in rejected] == [f"{p}:2", f"{p}:4"]
    assert "UTF-8" in rejected[0].reason
    # str paths work too, and load_seeds returns the same.
    s2, r2 = load_seeds("math", str(p))
    assert s2 == seeds and r2 == rejected


def test_same_seed_different_domains_is_not_duplicate():
    a = list(read_seeds([_line(GOOD)], "knowledge"))
    b = list(read_seeds([_line(GOOD)], "reasoning"))
    assert a[0]["id"] != b[0]["id"]


def test_differing_input_is_not_duplicate():
    items = list(read_seeds([_line(GOOD), _line({**GOOD, "input": "context"})], "knowledge"))
    assert all(isinstance(x, dict) for x in items)


def test_empty_file_is_an_error(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text("\n  \n")
    with pytest.raises(EmptyDomain, match="each domain needs at least one seed") as e:
        load_seeds("coding", p)
    assert str(p) in str(e.value) and "coding" in str(e.value)
    assert isinstance(e.value, ValueError)
    bad = tmp_path / "allbad.jsonl"
    bad.write_text("nope\n[]\n")
    with pytest.raises(EmptyDomain, match=r"2 line\(s\) rejected"):
        load_seeds("coding", bad)
    with pytest.raises(EmptyDomain, match="<lines>"):
        load_seeds("coding", [])


def test_unknown_default_domain_lists_known():
    with pytest.raises(ValueError) as e:
        default_seed_path("poetry")
    msg = str(e.value)
    assert "poetry" in msg
    for d in DOMAINS:
        assert d in msg
    with pytest.raises(ValueError):
        default_seed_path("../selfmoe/math")
    with pytest.raises(ValueError):
        load_seeds("poetry")


def test_bad_domain_argument():
    with pytest.raises(ValueError):
        list(read_seeds([_line(GOOD)], ""))
    with pytest.raises(TypeError):
        list(read_seeds(b"{}", "math"))
