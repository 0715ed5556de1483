"""The `--tiny` and `--json` flags of a benchmark script, in one place. Not a benchmark.

`--tiny` is the smoke-test size tests/test_bench.py runs: it sets the script's tiny defaults (flags
given on the command line still apply over them) and sends the figures to
$TMPDIR/shardsmith-bench-tiny/NAME.json, so bench/results/ is never touched by a smoke run."""
from __future__ import annotations

import argparse
import os
import tempfile


def tiny_folder() -> str:
    return os.path.join(tempfile.gettempdir(), "shardsmith-bench-tiny")


def parse(ap: argparse.ArgumentParser, argv, name: str, results: str, **tiny_defaults) -> argparse.Namespace:
    """Add --json and --tiny to `ap`, parse `argv`; `args.json` is where the figures go."""
    shown = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in tiny_defaults.items())
    ap.add_argument("--json", default=None, help=f"where to write the figures (default {results})")
    ap.add_argument("--tiny", action="store_true",
                    help=f"smoke-test size for tests/test_bench.py (figures meaningless): {shown}, figures to "
                         f"{os.path.join(tiny_folder(), name + '.json')}; flags given still apply")
    args = ap.parse_args(argv)
    if args.tiny:
        ap.set_defaults(**tiny_defaults)
        args = ap.parse_args(argv)
    args.json = args.json or (os.path.join(tiny_folder(), name + ".json") if args.tiny else results)
    return args
