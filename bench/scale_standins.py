"""Stand-ins for the models bench/scale.py needs: one OpenAI-compatible server on loopback whose
answers are scripted per dataset, so a run's cost is the pipeline's own, not a model's.

- selfmoe: a brainstorm completion proposes four Self-Instruct-like tasks
  (transforms/text/synthetic_instructions.py, seeded by the prompt, so a rerun asks and gets the
  same), and every task gets a short answer;
- rmaxts: the policy writes a three-tactic proof whose last tactic fails in the stand-in REPL
  (tests/lean_standin.py), so every search spends its whole budget and grows a tree;
- multiui: a caption, two question/answer pairs, an action-grounding instruction.

The server counts its requests per path, so the paper-scale table can say how many model calls
a dataset would make.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from transforms.text.synthetic_instructions import make_instructions


def _digest(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:12], 16)


def selfmoe_answer(path: str, body: dict) -> dict:
    if path.endswith("/chat/completions"):
        asked = body["messages"][-1]["content"]
        topic = " ".join(asked.split()[:12])
        return {"message": {"content": f"Here is a careful answer. {topic} comes down to three points: what it "
                                       f"is, why it matters, and how to act on it. Each is short and concrete."}}
    tasks = [t for t in make_instructions(6, seed=_digest(body["prompt"])) if t.strip()][:4]
    number = int(m.group(1)) if (m := re.search(r"Task (\d+):\s*$", body["prompt"])) else 1
    text = " " + tasks[0] + "".join(f"\nTask {number + i}: {t}" for i, t in enumerate(tasks[1:], start=1))
    return {"text": text + "\n"}


def rmaxts_answer(path: str, body: dict) -> dict:
    k = _digest(body["prompt"]) % 97
    return {"text": f"\n  intro h{k}\n  norm_num\n  exact fail_me\n```"}


def multiui_answer(path: str, body: dict) -> dict:
    prompt = body["messages"][-1]["content"] if "messages" in body else body.get("prompt", "")
    if isinstance(prompt, list):   # a multimodal message: its text parts
        prompt = " ".join(p.get("text", "") for p in prompt if isinstance(p, dict))
    lower = prompt.lower()
    if "instruction" in lower:
        text = "Instruction: Open the section that lists the opening hours of the nearest store."
    elif "question" in lower or "q/a" in lower:
        text = ("Q: What does the page offer to visitors?\nA: Outdoor gear, repairs and advice.\n"
                "Q: Where can a visitor find the store hours?\nA: In the stores section.")
    else:
        text = ("The page presents an outdoor equipment shop with a navigation bar and a main article. "
                "It lists products, services and contact details. A footer links to the other sections.")
    return {"message": {"content": text}} if "messages" in body else {"text": text}


ANSWERS = {"selfmoe": selfmoe_answer, "rmaxts": rmaxts_answer, "multiui": multiui_answer}


class ScriptedServer:
    """An OpenAI-compatible server on 127.0.0.1 answering with `answer(path, body)`; counts requests."""

    def __init__(self, answer):
        self.requests: Counter = Counter()
        counts, lock = self.requests, threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    counts[self.path] += 1
                choice = dict({"index": 0, "finish_reason": "stop"}, **answer(self.path, body))
                data = json.dumps({"id": "scripted", "object": "text_completion", "model": body.get("model", ""),
                                   "choices": [choice],
                                   "usage": {"prompt_tokens": 9, "completion_tokens": 9, "total_tokens": 18}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
