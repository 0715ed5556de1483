"""pruned-synth: real and verifier-pruned synthetic Gaussian-mixture data (docs/papers/pruned-synth.md)."""
from __future__ import annotations

import functools

from core.config import ConfigError, ConfigSpec, Key, Resolved
from pipelines.dataset import Dataset, content_digest
from schemas import pruned_synth as schema
from core import storage
from transforms.io.shards import TableSpec
from transforms.synth.experiment import experiment_id
from transforms.synth.features import FeaturesError, features_shape
from transforms.synth.pruned_synth_graph import PrunedSynthGraph, PrunedSynthSettings

UNIT = (0.0, 1.0)


def _features_shape(path: str):
    """The file's shape, read once per run: the config check runs for every grid point."""
    fs, inner = storage.filesystem(path)
    info = fs.get_file_info(inner)  # local or in a store: one metadata request
    return _shape_of(path, info.size, info.mtime_ns)


@functools.lru_cache(maxsize=4)
def _shape_of(path: str, size: int, mtime_ns: int):  # size and mtime: a rewritten file is read again
    return features_shape(path)


def _check(c: dict) -> None:
    if c["n"] + c["m"] == 0:
        raise ConfigError("n + m = 0: the classifier needs real (n) or synthetic (m) rows")
    if c["verifier"] == "learned" and c["n"] == 0:
        raise ConfigError("verifier=learned trains on the real rows: set n > 0")
    if c["features"]:
        if c["n_hat"] == 0:
            raise ConfigError("n_hat=0 means the exact generator N(y*mu, I), which needs the Gaussian "
                              "model; with a features file set 0 < n_hat <= n")
        if c["n_hat"] > c["n"]:
            raise ConfigError(f"with a features file the generator is fitted on the real rows: "
                              f"n_hat={c['n_hat']} must be <= n={c['n']}")
        try:
            shape = _features_shape(c["features"])
        except (FeaturesError, OSError, ValueError) as exc:
            raise ConfigError(f"features file unusable: {exc}") from None
        if shape.rows < c["n"] + c["n_test"]:
            raise ConfigError(f"features file {c['features']!r} has {shape.rows} rows, fewer than "
                              f"n + n_test = {c['n'] + c['n_test']}")


CONFIG = ConfigSpec(check=_check, keys=(
    Key("p", int, 100, "dimension of x (ignored with a features file: its width is used)", low=1),
    Key("n", int, 200, "real training rows", low=0),
    Key("n_hat", int, 200, "real rows the generator is estimated from; 0 = exact generator N(y*mu, I)", low=0),
    Key("m", int, 1000, "synthetic rows drawn before pruning", low=0),
    Key("mu_norm", float, 1.0, "||mu||, the class mean's norm (Gaussian mode)", low=0.0),
    Key("epsilon", float, 0.2, "probability a synthetic label is flipped", *UNIT),
    Key("rho", float, 0.3, "probability the verifier keeps a flipped row", *UNIT),
    Key("phi", float, 0.8, "probability the verifier keeps a correct row", *UNIT),
    Key("gamma", float, 1.0, "ridge regularisation (> 0)", low=1e-12),
    Key("n_test", int, 2000, "held-out test rows", low=1),
    Key("seed", int, 0, "seed of all random streams", low=0),
    Key("verifier", str, "rates", "rates: keep with (phi, rho); learned: ridge classifier on real rows",
        choices=("rates", "learned")),
    Key("features", str, None, "Parquet (x list, y) or .npz (x, y) of real features and +-1 labels; a path or "
        "an s3:// / gs:// URL",
        optional=True, is_path=True, gridable=False),
))

_PARAM_KEYS = tuple(k.name for k in CONFIG.keys)


def _digest(path: str | None) -> str | None:
    return content_digest(path) if path else None


def _experiments(resolved: Resolved) -> list[tuple[str, dict, list]]:
    digest = _digest(resolved.values["features"])
    out = []
    for point in resolved.grid:
        params = {k: point[k] for k in _PARAM_KEYS}
        out.append((experiment_id(params, digest), params, resolved.swept))
    return out


def tables(resolved: Resolved) -> dict[str, TableSpec]:
    return {"rows": TableSpec(schema.ROWS), "experiments": TableSpec(schema.EXPERIMENTS)}


def settings(resolved: Resolved) -> PrunedSynthSettings:
    """The graph's settings (transforms/synth/pruned_synth_graph.py) from the resolved config."""
    return PrunedSynthSettings(experiments=tuple(_experiments(resolved)))


def build(pipeline, resolved: Resolved, ledger):
    return pipeline | "PrunedSynth" >> PrunedSynthGraph(settings(resolved), ledger)


def inputs(resolved: Resolved) -> dict[str, str]:
    path = resolved.values["features"]
    return {"features": f"{path} sha256:{_digest(path)}"} if path else {}


class PrunedSynth(Dataset):
    name = schema.DATASET
    summary = "real + verifier-pruned synthetic Gaussian-mixture rows (RMT paper); ridge trainer vs theory"
    config = CONFIG
    schemas = schema.TABLES
    trainer = "trainers.pruned_synth:train"
    tables = staticmethod(tables)
    build = staticmethod(build)
    inputs = staticmethod(inputs)


DATASET = PrunedSynth()
