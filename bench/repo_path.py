"""Where the benchmarks live, with the repository root put on sys.path.

A script run as `python bench/NAME.py` has its own folder on sys.path but not the repository, so
every script imports this first: then `pipelines` and `transforms` come from the checkout the
script belongs to. Not a benchmark (no `__main__`)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))   # bench/
ROOT = os.path.dirname(HERE)                        # the repository
for _path in (ROOT, HERE):
    if _path not in sys.path:
        sys.path.insert(0, _path)
