"""Generate batches inside bounded hash buckets, never under one key (docs/architecture.md, contract 9).

No model: a stand-in backend writes each request's batch into its completion, so the tests see
exactly how requests were batched."""
from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from collections import Counter

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from transforms.io.stage import Ledger
from transforms.llm.backend import Backend
from transforms.llm.generate import (LEAVES, Generate, KeyByBucket, LeafCounts, batches_of, leaf_of,
                                     pack_leaves)
from transforms.llm.requests import Completion, Request, Sampling

SAMPLING = Sampling(max_tokens=4)


class BatchEcho(Backend):
    """A backend whose completion of a request names the batch it was generated in."""

    model_id = "batch-echo"
    batch_size = 4

    def load(self):
        return self

    def generate(self, requests):
        batch = ",".join(r.id for r in requests)
        return [Completion(r.id, batch, "stop", 1, 1, self.model_id, "echo") for r in requests]


def _requests(n: int, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    return [Request(f"r{i:05d}", "x" * rng.randrange(1, 60), SAMPLING) for i in range(n)]


def _expected_batches(requests: list[Request], size: int, cap: int) -> list[list[str]]:
    """What Generate must cut: batches_of inside each bucket of pack_leaves."""
    buckets = pack_leaves(Counter(leaf_of(r.id) for r in requests), cap)
    members: dict[int, list[Request]] = {}
    for r in requests:
        members.setdefault(buckets[leaf_of(r.id)], []).append(r)
    return sorted([r.id for r in batch] for rs in members.values() for batch in batches_of(rs, size))


# -- pure functions --------------------------------------------------------------------------------

def test_leaf_of_is_in_range_and_does_not_depend_on_the_process_hash_seed():
    ids = [f"r{i}" for i in range(200)]
    leaves = [leaf_of(i) for i in ids]
    assert all(0 <= leaf < LEAVES for leaf in leaves)
    assert len(set(leaves)) > 190           # spread, not one class
    code = ("import json; from transforms.llm.generate import leaf_of; "
            "print(json.dumps([leaf_of(f'r{i}') for i in range(200)]))")
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env=dict(os.environ, PYTHONHASHSEED=seed), cwd=os.path.dirname(os.path.dirname(__file__)))
        assert json.loads(out.stdout) == leaves


def test_pack_leaves_bounds_every_bucket_and_uses_few_buckets():
    counts = Counter(leaf_of(f"req-{i}") for i in range(20_000))
    cap = 300
    buckets = pack_leaves(counts, cap)
    assert set(buckets) == set(counts)
    sizes = Counter()
    for leaf, bucket in buckets.items():
        sizes[bucket] += counts[leaf]
    assert sum(sizes.values()) == 20_000
    assert max(sizes.values()) <= cap
    # next-fit: two neighbouring buckets together overflow the cap, so buckets are mostly full
    assert len(sizes) <= math.ceil(2 * 20_000 / cap)
    assert all(sizes[b] + sizes[b + 1] > cap for b in range(len(sizes) - 1))
    # each bucket is a run of consecutive leaves
    ordered = [buckets[leaf] for leaf in sorted(buckets)]
    assert ordered == sorted(ordered)


def test_pack_leaves_depends_on_the_counts_only():
    counts = {leaf_of(f"q{i}"): (i % 7) + 1 for i in range(3000)}
    shuffled = list(counts.items())
    random.Random(3).shuffle(shuffled)
    assert pack_leaves(dict(shuffled), 100) == pack_leaves(counts, 100)


def test_a_stage_within_the_cap_is_one_bucket_and_a_big_leaf_a_bucket_alone():
    assert set(pack_leaves({5: 10, 9: 20, 70: 30}, 60).values()) == {0}
    assert pack_leaves({1: 3, 2: 50, 3: 3}, 10) == {1: 0, 2: 1, 3: 2}


def test_leaf_counts_combine_does_not_depend_on_the_split():
    leaves = [leaf_of(f"q{i}") % 50 for i in range(1000)]
    fn = LeafCounts()

    def acc(values):
        a = fn.create_accumulator()
        for v in values:
            a = fn.add_input(a, v)
        return a

    whole = fn.extract_output(acc(leaves))
    parts = fn.extract_output(fn.merge_accumulators([acc(leaves[i::3]) for i in range(3)]))
    assert whole == parts == dict(Counter(leaves))


# -- in Beam ---------------------------------------------------------------------------------------

def _run_generate(requests, out_path, batch_size=4, bucket_requests=32, options=None):
    ledger = Ledger()
    runner = None if options is not None else FnApiRunner()
    with beam.Pipeline(runner=runner, options=options) as p:
        _ = (p | beam.Create(requests, reshuffle=False)
             | Generate(BatchEcho(), ledger, batch_size=batch_size, bucket_requests=bucket_requests)
             | beam.Map(lambda c: (c.request_id, c.text))
             | beam.combiners.ToList()
             | beam.Map(lambda pairs: open(out_path, "w").write(json.dumps(sorted(pairs)))))
    with open(out_path) as fh:
        return dict(json.load(fh))


def test_generate_gives_the_same_batches_whatever_the_order_of_arrival(tmp_path):
    requests = _requests(300)
    shuffled = list(requests)
    random.Random(7).shuffle(shuffled)
    first = _run_generate(requests, tmp_path / "a.json")
    again = _run_generate(list(reversed(shuffled)), tmp_path / "b.json")
    assert sorted(first) == [r.id for r in requests]
    assert first == again
    batches = sorted({tuple(text.split(",")) for text in first.values()})
    assert sorted(list(b) for b in batches) == _expected_batches(requests, 4, 32)
    assert max(len(b) for b in batches) == 4
    # batches are sorted by prompt length inside a bucket: cut from one sorted run, not the whole stage
    length = {r.id: len(r.prompt) for r in requests}
    assert all([length[i] for i in b] == sorted(length[i] for i in b) for b in batches)


def test_buckets_hold_at_most_the_cap_and_every_batch_lies_in_one_bucket(tmp_path):
    requests = _requests(300)
    out = tmp_path / "buckets.json"
    with beam.Pipeline(runner=FnApiRunner()) as p:
        _ = (p | beam.Create(requests)
             | KeyByBucket(32)
             | beam.Map(lambda kv: (kv[1].id, kv[0]))
             | beam.combiners.ToList()
             | beam.Map(lambda pairs: open(out, "w").write(json.dumps(sorted(pairs)))))
    bucket_of = dict(json.loads(out.read_text()))
    sizes = Counter(bucket_of.values())
    assert sorted(bucket_of) == [r.id for r in requests]
    assert max(sizes.values()) <= 32
    assert len(sizes) >= 300 // 32            # spread over many buckets, not one key
    for batch in _expected_batches(requests, 4, 32):
        assert len({bucket_of[i] for i in batch}) == 1


def test_few_requests_are_batched_as_one_sorted_run(tmp_path):
    """Within the bucket cap (every small run) the batches are those of the whole stage sorted."""
    requests = _requests(40, seed=2)
    done = _run_generate(requests, tmp_path / "few.json", batch_size=5, bucket_requests=1024)
    assert sorted({tuple(t.split(",")) for t in done.values()}) == \
        sorted(tuple(r.id for r in b) for b in batches_of(requests, 5))


@pytest.mark.cluster
def test_multiprocess_runner_batches_as_the_local_runner(tmp_path):
    requests = _requests(120, seed=5)
    local = _run_generate(requests, tmp_path / "local.json", bucket_requests=16)
    options = PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=multi_processing",
                               "--direct_num_workers=2"])
    multi = _run_generate(list(reversed(requests)), tmp_path / "multi.json", bucket_requests=16, options=options)
    assert multi == local
