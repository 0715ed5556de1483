"""Scripted model servers the tests share: OpenAI-compatible endpoints on loopback whose answers
depend only on the request, so every runner and every order of requests gets the same rows."""
from __future__ import annotations

import re
import time

from tests.conftest import ScriptedOpenAI


def task_text(domain: str, s: int) -> str:
    return f"Compute quantity{s} using method{s} for {domain}{s} case{s} in region{s}."


class ScriptedModel(ScriptedOpenAI):
    """Brainstorm: per request seed s, a usable task whose content words are its own (quantity<s>,
    method<s>, ...: ROUGE-L 0.5 against any other), a two-word task and a copy of request 0's
    usable task; answers: 'The answer is s.'"""

    def __init__(self):
        self.brainstorms, self.answers, self.times = [], [], []   # times: when each request came (monotonic)
        super().__init__(self._answer)

    def _answer(self, path, body):
        self.times.append(time.monotonic())
        if path.endswith("/chat/completions"):
            asked = body["messages"][-1]["content"]
            self.answers.append(asked)
            number = re.search(r"quantity(\d+)", asked)
            return {"message": {"content": f"The answer is {number.group(1) if number else 0}."}}
        s = body["seed"]
        self.brainstorms.append(s)
        domain = "coding" if "Python" in body["prompt"] else "math"
        return {"text": f" {task_text(domain, s)}\nTask 9: Add more.\nTask 10: {task_text(domain, 0)}\nTask 11: ok\n"}


class ScriptedPolicy(ScriptedOpenAI):
    """An OpenAI-compatible /v1/completions server: the completion depends on the theorem in the
    prompt, so each problem meets one kind of trouble."""

    def __init__(self, script: dict[str, str]):
        self.script, self.prompts = script, []
        super().__init__(self._answer)

    def _answer(self, path, body):
        self.prompts.append(body["prompt"])
        return {"text": next((v for k, v in self.script.items() if f"theorem {k}" in body["prompt"]), "")}
