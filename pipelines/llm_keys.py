"""The config keys of the LLM step, shared by every dataset that generates text (selfmoe, multiui,
rmaxts), and the backend they choose."""
from __future__ import annotations

import os
import shlex

from core.config import ConfigError, Key
from transforms.llm.models import resolve_model
from transforms.llm.openai_backend import OpenAIBackend
from transforms.llm.transformers_backend import TransformersBackend
from transforms.llm.vllm_backend import VllmBackend
from transforms.llm.vllm_server import VllmServerError

BACKENDS = ("transformers", "openai", "vllm")


def llm_keys(temperature: float = 0.7, batch_size: int = 16) -> tuple[Key, ...]:
    return (
        Key("backend", str, "transformers", "transformers (local model), vllm (a local vLLM server it starts) or "
            "openai (any OpenAI-compatible server)", choices=BACKENDS),
        Key("model", str, "smollm2-135m-instruct", "built-in model name, a local HF folder, or the served model name"),
        Key("base_url", str, None, "OpenAI-compatible endpoint for backend=openai", optional=True),
        Key("retries", int, 6, "backend=openai (and multiui's vision endpoint): retries of a request the endpoint failed transiently (connection, "
            "timeout, 429, 5xx), with exponential back-off from 0.5 s, at most 30 s; then the run fails with the "
            "reason", low=0, gridable=False),
        Key("concurrency", int, 8, "backend=openai: requests in flight at once in each worker process", low=1,
            gridable=False),
        Key("requests_per_minute", float, None, "backend=openai: requests a minute the whole job may send, every worker "
            "together (a hosted API's limit); each process takes its share", optional=True, low=1e-3, gridable=False),
        Key("tokens_per_minute", float, None, "backend=openai: tokens a minute the whole job may ask for (prompt and "
            "max_tokens, counted before sending), every worker together", optional=True, low=1.0, gridable=False),
        Key("vllm_python", str, None, "python of a venv with vLLM for backend=vllm (default: $SHARDSMITH_VLLM_PYTHON, "
            "then .venv-vllm/bin/python, built by `make vllm`)", optional=True, is_path=True, gridable=False),
        Key("vllm_args", str, "", "extra `vllm serve` arguments for backend=vllm, e.g. '--optimization-level 0' "
            "(skips torch.compile: starts minutes sooner on CPU)", gridable=False),
        Key("device", str, "cpu", "torch device for backend=transformers (cpu, cuda)"),
        Key("batch_size", int, batch_size, "requests per generate call", low=1),
        Key("temperature", float, temperature, "sampling temperature of the LLM steps (0 = greedy)", low=0.0, high=2.0),
        Key("top_p", float, 0.95, "nucleus sampling of the LLM steps", low=1e-6, high=1.0),
    )


def check_llm(c: dict) -> None:
    if c["backend"] == "openai" and not c["base_url"]:
        raise ConfigError("backend=openai needs base_url, e.g. http://127.0.0.1:8000/v1")


def make_backend(c: dict):
    """The backend the config names (built here, loaded on the workers)."""
    if c["backend"] == "openai":
        return OpenAIBackend(c["base_url"], c["model"], batch_size=c["batch_size"], max_retries=c["retries"],
                             concurrency=c.get("concurrency", 8), requests_per_minute=c.get("requests_per_minute"),
                             tokens_per_minute=c.get("tokens_per_minute"))
    if c["backend"] == "vllm":
        try:
            return VllmBackend(c["model"], batch_size=c["batch_size"], python=c["vllm_python"],
                               server_args=tuple(shlex.split(c.get("vllm_args") or "")))
        except VllmServerError as exc:
            raise ConfigError(f"backend=vllm: {exc}") from None
    return TransformersBackend(c["model"], device=c["device"], batch_size=c["batch_size"])


def base_model_setup(config: dict, manifest: dict) -> dict:
    """Trainer set-up of datasets an LLM wrote (selfmoe, rmaxts): the model to fine-tune is
    `base_model` if given, else the local folder of the model that wrote the data."""
    if config.get("base_model"):
        if not os.path.isdir(config["base_model"]):
            raise ConfigError(f"base_model {config['base_model']!r} is not a model folder")
        return config
    made_by = manifest.get("config", {})
    if made_by.get("backend", "transformers") != "transformers":
        raise ConfigError("the data came from a served model: pass --set base_model=PATH (a local HF folder)")
    try:
        path = resolve_model(made_by.get("model", "smollm2-135m-instruct")).path
    except (ValueError, FileNotFoundError, ImportError) as exc:
        raise ConfigError(f"cannot find the base model: {exc}; pass --set base_model=PATH") from None
    return dict(config, base_model=str(path))
