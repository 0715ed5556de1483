"""What the framework needs to know about one dataset."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable, Mapping

import apache_beam as beam

from core.config import ConfigError, ConfigSpec, Key, Resolved
from core import storage
from transforms.io.result_store import DEFAULT_ROOT, RESPONSES
from transforms.io.shards import TableSpec
from transforms.io.stage import Ledger

# every dataset has it: the root of the result store (stage results, LLM responses)
CACHE = Key("cache", str, DEFAULT_ROOT, "result store for expensive work (renders, Lean checks, backbone "
            "features, LLM responses): a folder or an s3:// / gs:// prefix; empty (cache=, or --no-resume) "
            "turns it off", optional=True, gridable=False)


@dataclass(frozen=True)
class Dataset:
    """A dataset: its config, its tables, how to build its pipeline, and its trainer.

    build(pipeline, resolved, ledger) returns {table: PCollection of rows};
    inputs(resolved) returns {input name: fingerprint} for the manifest;
    trainer is "module:function" in trainers/, imported only when training; `trainers` names more
    (`shardsmith train DATASET --trainer NAME`), e.g. concretizer's backbone pre-training.
    """

    name: str
    summary: str
    config: ConfigSpec
    tables: Callable[[Resolved], dict[str, TableSpec]]
    build: Callable[[beam.Pipeline, Resolved, Ledger], dict[str, beam.PCollection]]
    inputs: Callable[[Resolved], dict[str, str]]
    trainer: str
    trainers: Mapping[str, str] = field(default_factory=dict)
    # fills trainer config the trainer cannot work out itself (trainers import no transforms),
    # e.g. the local folder of the model that wrote the data: (config, manifest) -> config
    train_setup: Callable[[dict, dict], dict] | None = None
    # stages whose rejections are quality decisions about model output (garbage, refusals), not bad
    # input: their dead letters are written as usual but do not count towards --max-error-rate
    filter_stages: tuple[str, ...] = ()
    # what a user reads before a long run: resolved -> a summary of the inputs as read (printed to
    # stderr before the job starts); raises ConfigError when the inputs leave nothing to do
    preflight: Callable[[Resolved], str] | None = None
    # datasets with images: (dataset folder, png path or None, sample_id=, task=) -> the PNG written
    picture: Callable[..., str] | None = None

    def __post_init__(self):
        if all(k.name != CACHE.name for k in self.config.keys):
            object.__setattr__(self, "config", ConfigSpec(self.config.keys + (CACHE,), self.config.check))


def responses(c: dict) -> str | None:
    """Where the LLM response cache lives: the `responses` folder of the result store, or None (off)."""
    return storage.join(c["cache"], RESPONSES) if c.get("cache") else None


def check_cache(c: dict) -> None:
    """A result store that cannot take writes fails here, in one line, not at the first put on a worker."""
    if c.get("cache"):
        try:
            storage.check_writable(c["cache"])
        except storage.StorageError as exc:
            raise ConfigError(f"key 'cache': {exc}") from None


def content_digest(location: str) -> str:
    """sha256 hex of one file, local or in a store, streamed in blocks (inputs can be large)."""
    digest = hashlib.sha256()
    _feed(digest, location)
    return digest.hexdigest()


def _feed(digest, location: str) -> None:
    with storage.open_stream(location) as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)


def input_fingerprint(path: str) -> str:
    """How the manifest names an input: "PATH sha256:HEX" of a file, or of a folder's (a store
    prefix's) files: each relative name, then its bytes, in sorted order. Local or in a store alike,
    so the same bytes give the same fingerprint wherever they lie."""
    digest = hashlib.sha256()
    if storage.is_dir(path):
        for rel, _ in storage.list_files(path):
            digest.update(rel.encode())
            _feed(digest, storage.join(path, rel))
    else:
        _feed(digest, path)
    return f"{path} sha256:{digest.hexdigest()}"

