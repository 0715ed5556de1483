from transforms.text.self_instruct import (brainstorm_prompt, instruction_problem, normalised_instructions,
                                           parse_tasks, response_messages, response_problem)

SEEDS = [{"instruction": "Explain why the sky is blue.", "input": "", "output": "Rayleigh scattering."},
         {"instruction": "Convert the temperature to Celsius.", "input": "98.6 F", "output": "37 C"}]


def test_brainstorm_prompt_numbers_seeds_and_leaves_the_next_task_open():
    prompt = brainstorm_prompt("knowledge", SEEDS)
    assert "Task 1: Explain why the sky is blue." in prompt
    assert "Task 2: Convert the temperature to Celsius.\nInput: 98.6 F" in prompt
    assert prompt.endswith("Task 3:")
    assert "factual knowledge" in prompt


def test_parse_tasks_splits_numbered_continuations():
    completion = (" Name the largest planet in the solar system.\n"
                  "Task 4: Summarise the text in one sentence.\nInput: The cat sat on the mat all day.\n"
                  "Output: A cat sat.\n"
                  "task 5) Describe   photosynthesis\n  briefly.\n")
    assert parse_tasks(completion, 3) == [
        ("Name the largest planet in the solar system.", ""),
        ("Summarise the text in one sentence.", "The cat sat on the mat all day."),
        ("Describe photosynthesis briefly.", ""),
    ]
    assert parse_tasks("", 3) == [("", "")]


def test_instruction_filters_name_the_reason():
    seeds = normalised_instructions(SEEDS)
    assert instruction_problem("", seeds) == "empty"
    assert instruction_problem("Explain.", seeds).startswith("malformed")
    assert instruction_problem("word " * 200, seeds).startswith("too_long")
    assert instruction_problem("--- Explain gravity to a child", seeds).startswith("malformed")
    assert instruction_problem("explain why the SKY is blue!", seeds) == "copied_seed"
    assert instruction_problem("Explain why leaves change colour in autumn.", seeds) is None


def test_response_filters():
    assert response_problem("   ", "stop") == "empty"
    assert response_problem("I'm sorry, but I cannot help with that.", "stop") == "refusal"
    assert response_problem("As an AI, I have no opinion.", "stop") == "refusal"
    assert response_problem("word " * 700, "length") == "truncated"
    assert response_problem("A short answer that was cut", "length") == "truncated"  # any cut, not only long ones
    assert response_problem("Rayleigh scattering makes short wavelengths dominate.", "stop") is None


def test_response_messages_interleave_demonstrations():
    messages = response_messages("math", SEEDS, "Add 2 and 3.", "")
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert messages[3]["content"] == "Convert the temperature to Celsius.\n\n98.6 F"
    assert messages[-1]["content"] == "Add 2 and 3."


def test_a_domain_short_of_per_domain_is_counted():
    from core.rejected import Skipped
    from transforms.text import self_specialization as ss
    orders = [[0, 1], None, [0, 0]]
    out = ss.cap_cutoff("math", ss.first_kept(orders, 5), 5, 4)
    (short,) = [o for o in out if isinstance(o, Skipped)]
    assert short.count == 3 and "math: kept 2 of per_domain 5 after 4 rounds" in short.reason
    assert {cut for (domain, _), cut in out[:-1]} == {None} and len(out) == ss.CAP_PIECES + 1
    full = ss.cap_cutoff("math", ss.first_kept(orders, 2), 2, 4)
    assert not any(isinstance(o, Skipped) for o in full) and full[0] == (("math", 0), (0, 1))


def test_the_cap_keeps_the_first_good_rows_in_order_in_any_piece():
    from transforms.text import self_specialization as ss
    rows = [{"id": f"r{i}", "domain": "math", "kept": i % 3 != 0, "reject_reason": None if i % 3 else "rouge_l",
             "order": [i // 4, i % 4]} for i in range(40)]
    first = ss.first_kept(ss.first_kept([r["order"] if r["kept"] else None for r in rows[:20]], 10)
                          + [r["order"] if r["kept"] else None for r in rows[20:]], 10)   # merged as a combine
    ((_, cutoff), *_) = ss.cap_cutoff("math", first, 10, 4)
    pieces = {}
    for row in rows:
        pieces.setdefault(ss.cap_piece(row), []).append(row)
    assert len(pieces) > 4
    capped = sorted((r for group in pieces.values() for r in ss.cap_rows(group, cutoff)), key=lambda r: int(r["id"][1:]))
    good = [r for r in rows if r["kept"]]
    assert [r["id"] for r in capped if r["kept"]] == [r["id"] for r in good[:10]]
    assert {r["id"] for r in capped if r["reject_reason"] == "over_target"} == {r["id"] for r in good[10:]}
    assert all("order" not in r for r in capped)


def test_a_brainstorm_cut_at_the_token_limit_keeps_its_last_task_as_a_truncated_row():
    from transforms.llm.requests import Completion
    from transforms.text.self_specialization import candidates, dedup_domain
    text = ("Describe how tides form.\nTask 4: List three uses of copper wire.\n"
            "Task 5: Summarise the causes of the First World")
    meta = {"domain": "knowledge", "index": 0, "seed_ids": ["s1"], "first_number": 3, "round": 1}
    seeds = [{"id": f"s{i}", "instruction": s["instruction"], "input": s["input"]} for i, s in enumerate(SEEDS)]

    def rows(finish):
        found = candidates(meta, Completion(request_id="r", text=text, finish_reason=finish, prompt_tokens=5,
                                            completion_tokens=30, model="m", backend="test"))
        to_answer, dropped = dedup_domain("knowledge", seeds, found, threshold=0.7, answer_limit=10)
        return [c["instruction"] for c in to_answer], [(r["instruction"], r["reject_reason"]) for r in dropped]

    answered, dropped = rows("length")
    assert answered == ["Describe how tides form.", "List three uses of copper wire."]
    assert dropped == [("Summarise the causes of the First World", "truncated")]
    answered, dropped = rows("stop")  # a completion that ended by itself: its last task is whole
    assert len(answered) == 3 and dropped == []


def test_a_near_duplicate_drop_names_the_instruction_it_matched():
    """A ROUGE-L drop's row names the kept instruction or seed it matched; so does one matching an
    instruction answered in an earlier round."""
    from transforms.text.self_specialization import dedup_domain
    seeds = [{"id": "s0", "instruction": "Name the capital city of France.", "input": ""}]
    texts = ['Write a poem about the "sea" at night.', 'Write a poem about the "sea" at dawn.',
             "Name the capital city of Spain.", "List three uses of copper wire in houses."]
    found = [{"domain": "knowledge", "order": [0, i], "instruction": t, "input": "", "seed_ids": ["s0"], "model": "m",
              "round": 2} for i, t in enumerate(texts)]
    earlier = ("List three uses of copper wire in homes.",)
    to_answer, dropped = dedup_domain("knowledge", seeds, found, threshold=0.7, answer_limit=10, answered=earlier)
    assert [c["instruction"] for c in to_answer] == texts[:1]
    assert [(r["reject_reason"], r["near_duplicate"], r["round"]) for r in dropped] == [
        ("rouge_l", texts[0], 2), ("rouge_l", seeds[0]["instruction"], 2), ("rouge_l", earlier[0], 2)]


def test_rounds_go_on_at_the_yield_seen_until_the_domain_is_full():
    from transforms.text import self_specialization as ss
    seeds = [{"id": f"s{i}", "instruction": f"Seed task number {i}.", "input": "", "output": "x"} for i in range(3)]
    state = ss.first_state("math", seeds)
    assert ss.round_prompts(state, per_domain=8, oversample=3.0, tasks_per_prompt=4) == 6     # 24 tasks
    plan = ss.brainstorm_plan(state, 6, 2, __import__("transforms.llm.requests", fromlist=["Sampling"]).Sampling(), 0)
    assert [m["index"] for _, m in plan] == list(range(6)) and {m["round"] for _, m in plan} == {1}
    state = ss.after_answers(ss.after_dedup(state, 6, [{"instruction": "A new task to answer."}]), 2)
    assert (state.kept, state.prompts, state.round, state.answered) == (2, 6, 1, ("A new task to answer.",))
    # 6 missing at 2 kept per 6 prompts: 18 prompts (more than oversample alone asks: 5)
    assert ss.round_prompts(state, 8, 3.0, 4) == 18 and ss.answer_limit(state, 8) == 9
    again = ss.brainstorm_plan(state, 2, 2, plan[0][0].sampling, 0)
    assert [m["index"] for _, m in again] == [6, 7] and {m["round"] for _, m in again} == {2}
    assert not {r.id for r, _ in again} & {r.id for r, _ in plan}         # new requests, earlier ones cached
    nothing = ss.after_dedup(ss.first_state("math", seeds), 6, [])
    assert ss.round_prompts(nothing, 8, 3.0, 4) == 12                     # nothing kept: twice the prompts
    assert ss.round_prompts(ss.after_answers(nothing, 8), 8, 3.0, 4) == 0   # full: done
    starved = ss.after_dedup(ss.first_state("math", seeds), 40, [])
    assert ss.round_prompts(starved, 8, 3.0, 4) == 48                     # at most 8x round 1's prompts


