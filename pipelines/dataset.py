"""What the framework needs to know about one dataset."""
from __future__ import annotations

import hashlib
from typing import Mapping

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


class Dataset:
    """A dataset: the one class to subclass to add one, as Beam's ModelHandler or OpenPCDet's
    DatasetTemplate are.

    Required (a subclass that lacks one is refused when it is defined):
      name, summary         what `shardsmith list` shows; name is also the schemas' dataset name
      config                its ConfigSpec (the result store's `cache` key is added here)
      schemas               its tables' TableSchemas (registered with `schemas` on registration)
      trainer               "module:function" in trainers/, imported only when training
      tables(resolved)      {table: TableSpec} of this run
      build(pipeline, resolved, ledger)  {table: PCollection of rows}
      inputs(resolved)      {input name: fingerprint} for the manifest
    Optional, each with a working default:
      trainers              more trainers by name (`shardsmith train DATASET --trainer NAME`)
      filter_stages         stages whose rejections are quality decisions about model output
                            (garbage, refusals), not bad input: their dead letters do not count
                            towards --max-error-rate
      train_setup(config, manifest)  fills trainer config the trainer cannot work out itself
                            (trainers import no transforms), e.g. the local folder of the model
      preflight(resolved)   what a user reads before a long run (stderr), or None; raises
                            ConfigError when the inputs leave nothing to do
      picture(folder, png, sample_id=, task=)  datasets with images: the PNG written, or None
    A dataset's viewer look is pipelines/viewer/<name>.py, found by name (pipelines/viewer/look.py).
    """

    REQUIRED = ("name", "summary", "config", "schemas", "trainer")
    trainers: Mapping[str, str] = {}
    filter_stages: tuple[str, ...] = ()

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        missing = [a for a in cls.REQUIRED if not hasattr(cls, a)]
        missing += [m for m in ("tables", "build", "inputs") if getattr(cls, m) is getattr(Dataset, m)]
        if missing:
            raise TypeError(f"dataset {cls.__name__} lacks {', '.join(missing)} (pipelines/dataset.py: Dataset)")
        if all(k.name != CACHE.name for k in cls.config.keys):
            cls.config = ConfigSpec(cls.config.keys + (CACHE,), cls.config.check)

    def tables(self, resolved: Resolved) -> dict[str, TableSpec]:
        raise NotImplementedError

    def build(self, pipeline: beam.Pipeline, resolved: Resolved, ledger: Ledger) -> dict[str, beam.PCollection]:
        raise NotImplementedError

    def inputs(self, resolved: Resolved) -> dict[str, str]:
        raise NotImplementedError

    def train_setup(self, config: dict, manifest: dict) -> dict:
        return config

    def preflight(self, resolved: Resolved) -> str | None:
        return None

    def picture(self, folder: str, png: str | None, *, sample_id=None, task=None) -> str | None:
        return None

    def __repr__(self) -> str:
        return f"<dataset {self.name}>"


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

