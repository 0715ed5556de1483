"""A pipeline that generates completions through the cache and writes them as JSON lines.

Run by tests/test_llm_resume.py: in a subprocess that the test kills part-way, and through main() in
the test's own process for the uninterrupted run and the rerun.
Usage: python tests/llm_resume_job.py CACHE_DIR OUT_FILE N_PROMPTS
"""
import json
import os
import sys

import apache_beam as beam
import torch
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from transforms.io.stage import Ledger  # noqa: E402
from transforms.llm.generate import Generate  # noqa: E402
from transforms.llm.requests import Request, Sampling  # noqa: E402
from transforms.llm.transformers_backend import TransformersBackend  # noqa: E402


def main(cache, out, n):
    torch.set_num_threads(1)
    requests = [Request(f"q{i:03d}", f"Write one word about the number {i}:", Sampling(max_tokens=5))
                for i in range(n)]
    ledger = Ledger()
    with beam.Pipeline(runner=FnApiRunner()) as p:
        done = (p | beam.Create(requests)
                | Generate(TransformersBackend(batch_size=2), ledger, cache_location=cache, batch_size=2))
        _ = (done | beam.Map(lambda c: json.dumps({"id": c.request_id, "text": c.text, "cached": c.cached}))
             | beam.combiners.ToList()
             | beam.Map(lambda lines: open(out, "w").write("\n".join(sorted(lines)) + "\n")))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
