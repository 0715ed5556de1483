"""What every LLM backend is: the one contract the LLM step, the cache and rmaxts's policy rely on.

Beam's RunInference `ModelHandler` pattern: a backend is built on the launching machine (cheap,
picklable, no weights), travels to the workers inside the stage function, and there is loaded once
per process (`load`), asked batch after batch (`generate`), and closed when its last user is torn
down (`close`); `batch_size` is how many requests the step hands it at once. Subclasses:
TransformersBackend (local weights), VllmBackend (a local vLLM server it starts), OpenAIBackend
(any OpenAI-compatible server).
"""
from __future__ import annotations

from typing import Iterator, Optional, Sequence

from core.prompts import PROMPT_FORMATS
from transforms.llm.requests import Request



class Backend:
    """Completions (or Rejected) for batches of requests.

    A subclass implements `iter_batches` when it works in sub-batches, so that the response cache
    saves each one as it finishes (a worker killed mid-batch loses one sub-batch), or `generate`
    alone when one call is one batch; each method's default is built on the other. `model_id`
    (name@revision, or a served name) is what the cache keys on; `repr` must be stable and
    name the model and settings: the step shares one loaded copy per process under it.
    """

    name: str                # what Completion.backend says: "transformers", "vllm", "openai"
    batch_size: int = 16     # requests per batch of the LLM step (Generate), unless the step says otherwise

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.iter_batches is Backend.iter_batches and cls.generate is Backend.generate:
            raise TypeError(f"{cls.__name__} must implement iter_batches or generate (see transforms/llm/backend.py)")

    @property
    def model_id(self) -> str:
        raise NotImplementedError(f"{type(self).__name__} must define model_id: what the response cache keys on")

    def has_chat_template(self) -> Optional[bool]:
        """Whether the model has a chat template (an instruct model), False for a base model without
        one, None when the backend cannot tell (a remote server). Cheap: no weights are loaded."""
        return None

    def prompt_format(self, requested: str = "auto") -> str:
        """The prompt format to use, "chat" or "plain", for a config's `prompt_format` (auto | chat |
        plain): auto is plain when the model has no chat template, else chat (also when unknown:
        set plain explicitly for a base model behind an OpenAI-compatible server)."""
        if requested not in PROMPT_FORMATS:
            raise ValueError(f"prompt_format must be one of {', '.join(PROMPT_FORMATS)}, got {requested!r}")
        has_template = self.has_chat_template()
        if requested == "chat" and has_template is False:
            raise ValueError(f"prompt_format=chat, but {self.model_id} has no chat template (a base model): "
                             "use prompt_format=plain or auto")
        if requested == "auto":
            return "plain" if has_template is False else "chat"
        return requested

    def load(self) -> "Backend":
        """Make the backend ready on this worker (weights, a server); idempotent. Returns self."""
        return self

    def iter_batches(self, requests: Sequence[Request]) -> Iterator[list[tuple[int, object]]]:
        """[(index in requests, Completion | Rejected), ...] after each sub-batch; every index once."""
        yield list(enumerate(self.generate(requests)))

    def generate(self, requests: Sequence[Request]) -> list:
        """One Completion or Rejected per request, in the order given."""
        results: list = [None] * len(requests)
        for batch in self.iter_batches(requests):
            for index, result in batch:
                results[index] = result
        return results

    def close(self) -> None:
        """Free what `load` took (a server process); idempotent; a later call loads again."""
