"""Generation through the response cache: ask the model only what it was never asked before.

Hits come back with cached=True without touching the model (nor loading it). Misses go to the
backend, and each finished completion is written to the cache right after its sub-batch, so a
worker killed part-way loses at most one sub-batch: the rerun finds the rest in the cache and the
final output equals that of an uninterrupted run. Requests that ask the same question (same cache
key) within one call are generated once. Rejections are not cached: a rerun tries them again.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from transforms.llm.backend import Backend
from transforms.llm.cache import ResponseCache
from transforms.llm.requests import Completion, Request, cache_key


def _from_cache(cache: ResponseCache, key: str, request: Request) -> Optional[Completion]:
    value = cache.get(key)
    if not isinstance(value, dict):
        return None
    try:
        return Completion.from_json(value, request.id, cached=True)
    except (KeyError, TypeError, ValueError):  # an entry of another shape: a miss, rewritten below
        return None


def generate_with_cache(backend: Backend, cache: Optional[ResponseCache], requests: Sequence[Request]) -> list:
    """One Completion or Rejected per request, in order; cache=None generates everything."""
    if cache is None:
        return backend.generate(requests)
    model = backend.model_id
    keys = [cache_key(model, request) for request in requests]
    results: list = [None] * len(requests)
    asked: dict[str, list[int]] = {}  # cache key -> the indices that ask it
    for index, (request, key) in enumerate(zip(requests, keys)):
        hit = _from_cache(cache, key, request) if key not in asked else None
        if hit is not None:
            results[index] = hit
        else:
            asked.setdefault(key, []).append(index)
    if not asked:
        return results
    firsts = [indices[0] for indices in asked.values()]
    for batch in backend.iter_batches([requests[i] for i in firsts]):
        for position, result in batch:
            key = keys[firsts[position]]
            if isinstance(result, Completion):
                cache.put(key, result.to_json())
            for index in asked[key]:
                if isinstance(result, Completion):
                    results[index] = dataclasses.replace(result, request_id=requests[index].id)
                else:
                    results[index] = result if index == firsts[position] else dataclasses.replace(
                        result, excerpt=requests[index])
    return results
