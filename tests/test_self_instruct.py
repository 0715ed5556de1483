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
    from transforms.text.self_specialization import cap_domain_counted
    rows = [{"kept": True, "reject_reason": None, "order": [0, i]} for i in range(2)]
    out = cap_domain_counted("math", rows, 5)
    (short,) = [o for o in out if isinstance(o, Skipped)]
    assert short.count == 3 and "math: kept 2 of per_domain 5" in short.reason
    assert not any(isinstance(o, Skipped) for o in cap_domain_counted("math", rows, 2))


def test_a_brainstorm_cut_at_the_token_limit_keeps_its_last_task_as_a_truncated_row():
    from transforms.llm.requests import Completion
    from transforms.text.self_specialization import candidates, dedup_domain
    text = ("Describe how tides form.\nTask 4: List three uses of copper wire.\n"
            "Task 5: Summarise the causes of the First World")
    meta = {"domain": "knowledge", "index": 0, "seed_ids": ["s1"], "first_number": 3}
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
    """A ROUGE-L drop's reason quotes the kept instruction or seed it matched, read back exactly."""
    from transforms.text.self_specialization import dedup_domain, matched_instruction
    seeds = [{"id": "s0", "instruction": "Name the capital city of France.", "input": ""}]
    texts = ['Write a poem about the "sea" at night.', 'Write a poem about the "sea" at dawn.',
             "Name the capital city of Spain."]
    found = [{"domain": "knowledge", "order": [0, i], "instruction": t, "input": "", "seed_ids": ["s0"], "model": "m"}
             for i, t in enumerate(texts)]
    to_answer, dropped = dedup_domain("knowledge", seeds, found, threshold=0.7, answer_limit=10)
    assert [c["instruction"] for c in to_answer] == texts[:1]
    reasons = [r["reject_reason"] for r in dropped]
    assert reasons == ['rouge_l: near-duplicate of "Write a poem about the \\"sea\\" at night."',
                       'rouge_l: near-duplicate of "Name the capital city of France."']
    assert [matched_instruction(r) for r in reasons] == [texts[0], seeds[0]["instruction"]]
    assert matched_instruction("malformed: fewer than 3 words") is None and matched_instruction(None) is None
