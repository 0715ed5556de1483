"""What is asked of a model and what comes back, independent of the backend that answers.

`Request` and `Sampling` are frozen so that equal requests hash equal; `cache_key` reduces a
request to the parts that decide the answer (model, prompt, sampling), so the same question
asked by another dataset, another worker or another backend finds the same cache entry.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence, Union

from transforms.io.ids import canonical_json

CACHE_KEY_VERSION = 1
MAX_SEED = 2**63 - 1
FINISH_REASONS = ("stop", "length")

Message = Mapping[str, str]
Prompt = Union[str, tuple]  # a plain text, or a tuple of chat messages {"role", "content"}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Sampling:
    """How to decode: greedy when temperature == 0, else sampling with temperature and top_p.

    `seed` makes sampling repeatable; greedy decoding ignores `seed` and `top_p`.
    `stop` strings end the completion before their first occurrence (the stop string is not kept).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int = 0

    def __post_init__(self):
        if not _is_number(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"Sampling.temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"Sampling.top_p must be a number in (0, 1], got {self.top_p!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"Sampling.max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        try:
            stop = tuple(stop)
        except TypeError:
            raise ValueError(f"Sampling.stop must be a string or a sequence of strings, got {self.stop!r}") from None
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"Sampling.stop must hold non-empty strings only, got {self.stop!r}")
        if not _is_int(self.seed) or not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"Sampling.seed must be an integer in [0, 2**63 - 1], got {self.seed!r}")
        # canonical types, so that Sampling(temperature=1) and Sampling(temperature=1.0) are equal
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))
        object.__setattr__(self, "stop", stop)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def key_params(self) -> dict:
        """The parameters that decide the output on any backend; greedy ignores top_p and seed."""
        params = asdict(self)
        params["stop"] = list(self.stop)
        if self.greedy:
            params["top_p"] = params["seed"] = None
        return params


CONTENT_PARTS = ("text", "image_url")


def _normalize_content(content: Any, i: int) -> Union[str, tuple]:
    """A message's content: a string, or OpenAI-style parts ({"type": "text", "text"} and
    {"type": "image_url", "image_url": {"url"}}) for vision models."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, Mapping) and content:
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, Mapping) else None
            ok = ((kind == "text" and isinstance(part.get("text"), str))
                  or (kind == "image_url" and isinstance(part.get("image_url"), Mapping)
                      and isinstance(part["image_url"].get("url"), str)))
            if not ok:
                raise ValueError(f"chat message {i}: a content part must be {{'type': 'text', 'text': str}} or "
                                 f"{{'type': 'image_url', 'image_url': {{'url': str}}}}, got {part!r}")
            parts.append(canonical_part(part))
        return tuple(parts)
    raise ValueError(f"chat message {i} must have string 'content' or a non-empty list of content parts, "
                     f"got {content!r}")


def canonical_part(part: Mapping) -> dict:
    if part["type"] == "text":
        return {"type": "text", "text": part["text"]}
    return {"type": "image_url", "image_url": {"url": part["image_url"]["url"]}}


def content_text(content: Union[str, tuple]) -> str:
    """The text of a message's content (image parts left out)."""
    if isinstance(content, str):
        return content
    return "".join(p["text"] for p in content if p["type"] == "text")


def _normalize_prompt(prompt: Any) -> Prompt:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Mapping) or not isinstance(prompt, Sequence) or not prompt:
        raise ValueError("Request.prompt must be a string or a non-empty sequence of chat messages "
                         f"{{'role': ..., 'content': ...}}, got {type(prompt).__name__}")
    messages = []
    for i, message in enumerate(prompt):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ValueError(f"chat message {i} must be a mapping with string 'role' and 'content', got {message!r}")
        messages.append(dict(message, content=_normalize_content(message.get("content"), i)))
    return tuple(messages)


@dataclass(frozen=True)
class Request:
    """One prompt to complete. `id` is the caller's (a row id); it does not enter the cache key."""

    id: str
    prompt: Prompt
    sampling: Sampling = field(default_factory=Sampling)

    def __post_init__(self):
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"Request.id must be a non-empty string, got {self.id!r}")
        if not isinstance(self.sampling, Sampling):
            raise ValueError(f"Request.sampling must be a Sampling, got {type(self.sampling).__name__}")
        object.__setattr__(self, "prompt", _normalize_prompt(self.prompt))

    @property
    def is_chat(self) -> bool:
        return not isinstance(self.prompt, str)

    @property
    def has_images(self) -> bool:
        """Whether a message carries an image part (only vision backends can answer it)."""
        return self.is_chat and any(not isinstance(m["content"], str) and
                                    any(p["type"] == "image_url" for p in m["content"]) for m in self.prompt)

    def __hash__(self):  # chat messages are dicts: hash their canonical form
        return hash((self.id, canonical_json(self.prompt), self.sampling))


@dataclass(frozen=True)
class Completion:
    """A model's answer to one request; `cached` says it came from the response cache."""

    request_id: str
    text: str
    finish_reason: str  # "stop" (end of sequence or a stop string) | "length" (max_tokens reached)
    prompt_tokens: int
    completion_tokens: int
    model: str
    backend: str
    cached: bool = False

    def __post_init__(self):
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"Completion.finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}")

    def to_json(self) -> dict:
        """The cacheable part: everything but the request id and the cached flag."""
        data = asdict(self)
        del data["request_id"], data["cached"]
        return data

    @classmethod
    def from_json(cls, data: Mapping, request_id: str, cached: bool = True) -> "Completion":
        return cls(request_id=request_id, text=str(data["text"]), finish_reason=str(data["finish_reason"]),
                   prompt_tokens=int(data["prompt_tokens"]), completion_tokens=int(data["completion_tokens"]),
                   model=str(data["model"]), backend=str(data["backend"]), cached=cached)


def cache_key(model: str, request: Request) -> str:
    """Hex sha256 of what decides a completion: the model (name@revision), the prompt and the
    backend-independent sampling parameters. Request ids, batch sizes and devices stay out."""
    payload = {"v": CACHE_KEY_VERSION, "model": model,
               "prompt": {"chat": list(request.prompt)} if request.is_chat else {"text": request.prompt},
               "sampling": request.sampling.key_params()}
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()
