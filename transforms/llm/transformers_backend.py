"""Generate completions with Hugging Face transformers, on CPU or one GPU, in batches.

One backend per worker process: `load()` reads the model once, and the Beam wrapper will hold the
loaded backend through `apache_beam.utils.shared.Shared` (acquire(lambda: backend.load())), so every
DoFn instance and bundle in the process shares one copy of the weights. The element handed to
`generate` is already a list of requests (batched upstream, since BatchElements/RunInference rely
on finish_bundle outputs that the DaskRunner drops).

How a batch runs:
- requests are grouped by how they decode (greedy, or one temperature and top_p) and each group runs
  in sub-batches of `batch_size`, longest prompts first (so an out-of-memory shows on the first
  sub-batch, and padding stays small). Requests that differ only in max_tokens, stop strings or seed
  share a batch (multiui's captions, answers and instructions: one batch, not three): each row stops
  at its own limit and its own stop strings, so a decoding step, which on the CPU costs reading the
  weights once whatever the batch, serves them all;
- prompts are LEFT-padded, so every row's next token sits at the same position;
- greedy when temperature == 0; otherwise each row samples from its own torch.Generator, seeded from
  sampling.seed and the prompt, by the Gumbel-max trick over temperature/top_p-filtered logits. A
  row's output so never depends on which other requests share its batch: the same request gives the
  same completion batched or alone, on every worker (what stable ids and the cache rely on);
- stop strings end generation early (a stopping criterion on each row's decoded tail) and the text
  is cut before the first stop string;
- a chat prompt goes through the tokenizer's chat template; a plain prompt (a string: what a base
  model without a chat template is asked with, see `Backend.prompt_format`) is tokenized as it is,
  with the tokenizer's special tokens (BOS), and a chat prompt to a model without a template is
  rejected with that reason;
- a request that cannot run (empty, or longer than the model's context) becomes `Rejected`; a
  sub-batch that raises is retried one request at a time, so only the failing request is rejected.

Token counts: `prompt_tokens` is the length of the prompt as fed to the model (after the chat
template); `completion_tokens` counts the generated tokens, up to the one that completed a stop
string, without the end-of-sequence token.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
from typing import Iterator, Optional, Sequence

from transforms.io.ids import canonical_json
from core.rejected import Rejected
from transforms.llm.backend import Backend
from core import machine
from transforms.llm.models import DEFAULT_MODEL, LocalModel, ResolvedModel
from transforms.llm.requests import Completion, Request, Sampling

BACKEND_NAME = "transformers"


def _row_seed(sampling: Sampling, request: Request) -> int:
    """The seed of one row: from sampling.seed and the prompt, never from the batch around it."""
    text = canonical_json([sampling.seed, list(request.prompt) if request.is_chat else request.prompt])
    return int(hashlib.sha256(text.encode()).hexdigest()[:15], 16)


class TransformersBackend(LocalModel, Backend):
    """Batched generation with transformers. `model` is a built-in name, a local HF folder or a
    ResolvedModel; `dtype` defaults to float32 on CPU and bfloat16 on CUDA. `threads` caps torch's
    CPU threads for the whole process (torch.set_num_threads). By default, on the CPU, each process
    takes its share of the machine's cores among the processes generating on it (core/machine.py),
    asked again before each batch, never more than OMP_NUM_THREADS where that is set: spinning OpenMP threads that oversubscribe the cores make CPU
    generation several times slower."""

    name = BACKEND_NAME

    def __init__(self, model: str | ResolvedModel = DEFAULT_MODEL, device: str = "cpu",
                 dtype: Optional[str] = None, batch_size: int = 16, threads: Optional[int] = None):
        missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
        if missing:
            raise ImportError(f"TransformersBackend needs {' and '.join(missing)}: pip install 'shardsmith[llm]'")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be an integer >= 1 or None, got {threads!r}")
        self.model, self.device, self.dtype, self.batch_size = model, device, dtype, batch_size
        self.threads = threads
        self._resolved: Optional[ResolvedModel] = model if isinstance(model, ResolvedModel) else None
        self._model = self._tokenizer = None

    def __getstate__(self):  # pickled into Beam DoFns without the weights; load() runs on the worker
        state = dict(self.__dict__)
        state["_model"] = state["_tokenizer"] = None
        return state

    def __repr__(self):
        return f"TransformersBackend({self.model!r}, device={self.device!r}, batch_size={self.batch_size})"

    @property
    def tokenizer(self):
        return self.load()._tokenizer

    def load(self) -> "TransformersBackend":
        """Load tokenizer and weights (once; later calls return at once). Returns self."""
        if self._model is not None:
            return self
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self.threads:
            torch.set_num_threads(self.threads)
        else:
            self._size_threads()   # counted among the machine's generating processes from the start
        dtype = self.dtype or ("bfloat16" if str(self.device).startswith("cuda") else "float32")
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        path = self.resolved.path
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(self.device).eval()
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = tokenizer.eos_token_id
        self._eos_ids = {eos} if isinstance(eos, int) else set(eos or ())
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = model.generation_config.pad_token_id
        if pad is None:
            pad = min(self._eos_ids) if self._eos_ids else 0
        self._pad_id = pad
        self._context = getattr(model.config, "max_position_embeddings", None)
        self._tokenizer, self._model = tokenizer, model
        return self

    # -- public API ------------------------------------------------------------------------------

    def iter_batches(self, requests: Sequence[Request]) -> Iterator[list[tuple[int, object]]]:
        """Run `requests` sub-batch by sub-batch, yielding [(index in requests, result), ...] after
        each, so a caller can save results as they come (generate_with_cache does)."""
        self.load()
        rejected, groups = [], {}
        for index, request in enumerate(requests):
            try:
                ids = self._encode(request)
            except Exception as exc:  # a template or tokenizer error belongs to this request only
                rejected.append((index, Rejected(f"could not build the prompt: {exc}", request, type(exc).__name__)))
                continue
            problem = self._check_length(len(ids), request.sampling)
            if problem:
                rejected.append((index, Rejected(problem, request, "PromptTooLong" if ids else "EmptyPrompt")))
                continue
            groups.setdefault(_decoding(request.sampling), []).append((index, ids))
        if rejected:
            yield rejected
        for sampling, items in groups.items():
            items.sort(key=lambda item: -len(item[1]))
            for start in range(0, len(items), self.batch_size):
                chunk = items[start:start + self.batch_size]
                self._size_threads()
                yield self._run_chunk(sampling, chunk, requests)

    # -- internals -------------------------------------------------------------------------------

    def _encode(self, request: Request) -> list[int]:
        tokenizer = self._tokenizer
        if request.has_images:
            raise ValueError(f"{self.model_id} reads text only; this request holds an image: "
                             "use a vision-capable backend (backend=openai serving a vision model)")
        if request.is_chat:
            if not tokenizer.chat_template:
                raise ValueError(f"{self.model_id} has no chat template: send plain-text prompts")
            text = tokenizer.apply_chat_template(list(request.prompt), tokenize=False, add_generation_prompt=True)
            return list(tokenizer(text, add_special_tokens=False)["input_ids"])
        return list(tokenizer(request.prompt)["input_ids"])

    def _check_length(self, n_prompt: int, sampling: Sampling) -> Optional[str]:
        if n_prompt == 0:
            return "the prompt is empty (0 tokens)"
        if self._context and n_prompt + sampling.max_tokens > self._context:
            return (f"the prompt has {n_prompt} tokens; with max_tokens={sampling.max_tokens} that passes "
                    f"the model's context of {self._context} tokens: shorten the prompt or lower max_tokens")
        return None

    def _run_chunk(self, sampling, chunk, requests) -> list[tuple[int, object]]:
        try:
            return self._generate_batch(sampling, chunk, requests)
        except Exception as exc:
            if len(chunk) == 1:
                index = chunk[0][0]
                return [(index, Rejected(f"generation failed: {exc}", requests[index], type(exc).__name__))]
        # one request spoiled the batch (or it did not fit): retry one by one to find which
        return [result for item in chunk for result in self._run_chunk(sampling, [item], requests)]

    def _size_threads(self) -> None:
        """Take this process's share of the cores (unless `threads` fixed it, or the model is on a GPU)."""
        if self.threads or not str(self.device).startswith("cpu"):
            return
        import torch
        share = machine.share_of_cores("torch-generate")
        if os.environ.get("OMP_NUM_THREADS", "").isdigit():   # the user's (or the runner's) own cap holds
            share = max(1, min(share, int(os.environ["OMP_NUM_THREADS"])))
        if torch.get_num_threads() != share:
            torch.set_num_threads(share)

    def _generate_batch(self, sampling: Sampling, chunk, requests) -> list[tuple[int, Completion]]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        width = max(len(ids) for _, ids in chunk)
        input_ids = torch.full((len(chunk), width), self._pad_id, dtype=torch.long)
        attention = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, (_, ids) in enumerate(chunk):  # LEFT padding
            input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
            attention[row, width - len(ids):] = 1
        rows = [requests[index].sampling for index, _ in chunk]   # max_tokens and stop differ by row
        config = GenerationConfig(max_new_tokens=max(r.max_tokens for r in rows), do_sample=False, num_beams=1,
                                  pad_token_id=self._pad_id, eos_token_id=sorted(self._eos_ids) or None)
        processors = LogitsProcessorList()
        if not sampling.greedy:
            seeds = [_row_seed(requests[index].sampling, requests[index]) for index, _ in chunk]
            processors.append(_SeededSampler(sampling.temperature, sampling.top_p, seeds, self.device))
        stopping = StoppingCriteriaList()
        if len({r.max_tokens for r in rows}) > 1:
            stopping.append(_RowLimits([r.max_tokens for r in rows], width))
        if any(r.stop for r in rows):
            stopping.append(_StopStrings(self._tokenizer, [r.stop for r in rows], width))
        with torch.inference_mode():
            output = self._model.generate(input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device),
                                          generation_config=config, logits_processor=processors,
                                          stopping_criteria=stopping)
        generated = output[:, width:].tolist()
        return [(index, self._completion(rows[row], len(ids), generated[row][:rows[row].max_tokens],
                                         requests[index].id))
                for row, (index, ids) in enumerate(chunk)]

    def _completion(self, sampling: Sampling, n_prompt: int, tokens: list[int], request_id: str) -> Completion:
        ids, hit_eos = [], False
        for token in tokens:
            if token in self._eos_ids:
                hit_eos = True
                break
            ids.append(token)
        decode = lambda part: self._tokenizer.decode(part, skip_special_tokens=True)  # noqa: E731
        text = decode(ids)
        cut = min((text.find(s) for s in sampling.stop if s in text), default=-1)
        if cut >= 0:
            text, finish = text[:cut], "stop"
            n_tokens = _first_prefix(len(ids), lambda k: any(s in decode(ids[:k]) for s in sampling.stop))
        else:
            n_tokens = len(ids)
            finish = "length" if not hit_eos and n_tokens >= sampling.max_tokens else "stop"
        return Completion(request_id=request_id, text=text, finish_reason=finish, prompt_tokens=n_prompt,
                          completion_tokens=n_tokens, model=self.model_id, backend=self.name)


def _decoding(sampling: Sampling) -> Sampling:
    """What rows must share to share a batch: greedy, or one temperature and top_p. Seeds differ by row
    anyway (_row_seed), and max_tokens and stop strings are each row's own (_RowLimits, _StopStrings)."""
    if sampling.greedy:
        return Sampling(temperature=0.0, max_tokens=1)
    return Sampling(temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=1)


def _first_prefix(n: int, holds) -> int:
    """The smallest k in [1, n] with holds(k), for holds monotone in k (binary search)."""
    low, high = 1, n
    while low < high:
        mid = (low + high) // 2
        if holds(mid):
            high = mid
        else:
            low = mid + 1
    return low


class _SeededSampler:
    """Sampling as a logits processor: temperature, top-p, then Gumbel noise from each row's own
    generator; the greedy step that follows picks exactly a sample of the filtered distribution."""

    def __init__(self, temperature: float, top_p: float, seeds: list[int], device):
        import torch

        self.temperature, self.top_p = temperature, top_p
        self.generators = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]

    def __call__(self, input_ids, scores):
        import torch

        scores = scores.float() / self.temperature
        if self.top_p < 1.0:
            ordered, order = scores.sort(dim=-1, descending=True)
            probs = ordered.softmax(dim=-1)
            drop = (probs.cumsum(dim=-1) - probs) >= self.top_p  # the top token is always kept
            scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
        tiny = torch.finfo(torch.float32).tiny
        uniform = torch.stack([torch.rand(scores.shape[-1], generator=g, device=scores.device)
                               for g in self.generators]).clamp_(min=tiny, max=1.0 - 1e-7)
        return scores - torch.log(-torch.log(uniform))


class _RowLimits:
    """Stops each row at its own max_tokens (the batch runs to the largest)."""

    def __init__(self, limits: list[int], prompt_width: int):
        self.limits, self.prompt_width = limits, prompt_width

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        made = input_ids.shape[1] - self.prompt_width
        return torch.tensor([made >= limit for limit in self.limits], dtype=torch.bool, device=input_ids.device)


class _StopStrings:
    """Stops a row once its decoded tail holds one of its stop strings (the text is cut afterwards)."""

    def __init__(self, tokenizer, stops: list[tuple[str, ...]], prompt_width: int):
        self.tokenizer, self.stops, self.prompt_width = tokenizer, stops, prompt_width
        # a character may take up to 4 byte tokens
        self.window = 4 * max(len(s) for row in stops for s in row) + 4

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        tails = input_ids[:, self.prompt_width:][:, -self.window:].tolist()
        texts = self.tokenizer.batch_decode(tails, skip_special_tokens=True)
        return torch.tensor([any(s in text for s in row) for text, row in zip(texts, self.stops)],
                            dtype=torch.bool, device=input_ids.device)
