"""What every LLM backend shares: results in input order, built from its sub-batches."""
from __future__ import annotations

from typing import Iterator, Sequence

from transforms.llm.requests import Request


class BatchedBackend:
    """A backend implements `iter_batches`, yielding [(index, Completion | Rejected), ...] after each
    sub-batch (so results can be cached as they come); `generate` collects them in input order."""

    def iter_batches(self, requests: Sequence[Request]) -> Iterator[list[tuple[int, object]]]:
        raise NotImplementedError

    def generate(self, requests: Sequence[Request]) -> list:
        """One Completion or Rejected per request, in the order given."""
        results: list = [None] * len(requests)
        for batch in self.iter_batches(requests):
            for index, result in batch:
                results[index] = result
        return results
