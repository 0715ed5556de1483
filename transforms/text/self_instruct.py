"""Self-Instruct prompts, parsing and filters for self-specialization (Self-MoE, docs/papers/selfmoe.md).

The base model is shown k seeds of one domain as numbered tasks and asked to
continue the list; its continuation is parsed back into (instruction, input)
pairs. A second prompt asks it to answer one instruction after seed
demonstrations: chat messages for a model with a chat template, an Alpaca-style
text prompt for a base model (prompt_format plain). The filters name why a pair or an answer is dropped, so the
shards keep every rejected row with its reason.
"""
from __future__ import annotations

import re
from typing import Sequence

from core.prompts import plain_prompt

DOMAIN_DESCRIPTIONS = {
    "knowledge": "questions that test factual knowledge of science, history, geography, society and culture",
    "reasoning": "problems that need careful logical, causal or commonsense reasoning",
    "math": "grade-school math word problems that need several arithmetic steps",
    "coding": "small Python programming tasks, each asking for one function",
}

REFUSALS = re.compile(
    r"\b(i'?m sorry|i am sorry|i apologi[sz]e|i can(?:no|')t (?:help|assist|answer|do)|"
    r"as an ai\b|as a language model|i am unable|i'm unable)", re.IGNORECASE)
_TASK = re.compile(r"^\s*task\s*(\d+)\s*[:.)-]\s*", re.IGNORECASE | re.MULTILINE)
_INPUT = re.compile(r"^\s*input\s*:\s*", re.IGNORECASE | re.MULTILINE)
_OUTPUT = re.compile(r"^\s*(output|answer|response)\s*:", re.IGNORECASE | re.MULTILINE)


def describe(domain: str) -> str:
    return DOMAIN_DESCRIPTIONS.get(domain, f"tasks in the domain '{domain}'")


def _task_block(number: int, instruction: str, input_text: str) -> str:
    block = f"Task {number}: {instruction.strip()}"
    if input_text.strip():
        block += f"\nInput: {input_text.strip()}"
    return block


def brainstorm_prompt(domain: str, seeds: Sequence[dict]) -> str:
    """A numbered list of seed tasks that the model continues with new ones (plain completion)."""
    lines = [f"Come up with a series of new, diverse tasks: {describe(domain)}.",
             "Each task is one instruction, optionally with an input. Do not repeat a task.", ""]
    lines += [_task_block(i + 1, s["instruction"], s.get("input", "")) for i, s in enumerate(seeds)]
    lines.append(f"Task {len(seeds) + 1}:")
    return "\n".join(lines)


def parse_tasks(completion: str, first_number: int) -> list[tuple[str, str]]:
    """(instruction, input) pairs from a continuation that starts right after `Task {first_number}:`."""
    text = f"Task {first_number}: " + completion
    starts = list(_TASK.finditer(text))
    tasks = []
    for match, nxt in zip(starts, starts[1:] + [None]):
        block = text[match.end(): nxt.start() if nxt else len(text)]
        cut = _OUTPUT.search(block)
        if cut:
            block = block[: cut.start()]
        parts = _INPUT.split(block, maxsplit=1)
        instruction = " ".join(parts[0].split())
        input_text = parts[1].strip() if len(parts) > 1 else ""
        tasks.append((instruction, input_text))
    return tasks


def response_messages(domain: str, demonstrations: Sequence[dict], instruction: str,
                      input_text: str) -> tuple[dict, ...]:
    """Chat messages: a system line for the domain, seed demonstrations as turns, then the task."""
    messages = [{"role": "system",
                 "content": f"You are an expert assistant for {describe(domain)}. Answer correctly and concisely."}]
    for demo in demonstrations:
        messages.append({"role": "user", "content": _user_turn(demo["instruction"], demo.get("input", ""))})
        messages.append({"role": "assistant", "content": demo["output"]})
    messages.append({"role": "user", "content": _user_turn(instruction, input_text)})
    return tuple(messages)


def response_prompt(domain: str, demonstrations: Sequence[dict], instruction: str, input_text: str,
                    prompt_format: str = "chat"):
    """The prompt that asks for a response: chat messages (response_messages) for a model with a
    chat template, or for a base model (prompt_format="plain") the Alpaca-style text of
    core/prompts.plain_prompt with the demonstrations as solved blocks; send it with
    core/prompts.PLAIN_STOP as stop strings so the model stops after its answer."""
    if prompt_format == "plain":
        return plain_prompt(instruction, input_text, demonstrations)
    if prompt_format != "chat":
        raise ValueError(f"prompt_format must be chat or plain, got {prompt_format!r}")
    return response_messages(domain, demonstrations, instruction, input_text)


def _user_turn(instruction: str, input_text: str) -> str:
    return instruction.strip() + (f"\n\n{input_text.strip()}" if input_text.strip() else "")


def _normal(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text.lower()).split())


def instruction_problem(instruction: str, seed_instructions: set[str], max_words: int = 150) -> str | None:
    """Why a brainstormed instruction is unusable, or None. `seed_instructions` are normalised."""
    words = instruction.split()
    if not words:
        return "empty"
    if len(words) < 3:
        return "malformed: fewer than 3 words"
    if len(words) > max_words:
        return f"too_long: {len(words)} words > {max_words}"
    if not re.match(r"[A-Za-z0-9\"'(]", instruction):
        return "malformed: does not start with a letter or digit"
    if _TASK.search(instruction) or _INPUT.search(instruction):
        return "malformed: holds a task or input marker"
    if _normal(instruction) in seed_instructions:
        return "copied_seed"
    return None


def response_problem(response: str, finish_reason: str) -> str | None:
    """Why an answer is unusable, or None. An answer cut off at the token limit is never training
    data, however long it is: an expert trained on it learns to stop mid-sentence."""
    words = response.split()
    if not words:
        return "empty"
    if finish_reason == "length":
        return "truncated"
    if REFUSALS.search(response[:200]):
        return "refusal"
    return None


def normalised_instructions(seeds: Sequence[dict]) -> set[str]:
    return {_normal(s["instruction"]) for s in seeds}
