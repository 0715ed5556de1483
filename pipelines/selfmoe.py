"""selfmoe: self-specialization data per domain (Self-MoE, docs/papers/selfmoe.md)."""
from __future__ import annotations

from core.config import ConfigError, ConfigSpec, Key, Resolved, settings_from
from pipelines.dataset import Dataset, input_fingerprint, responses
from pipelines.llm_keys import base_model_setup, check_llm, llm_keys, make_backend
from schemas import selfmoe as schema
from core import storage
from transforms.io.shards import TableSpec
from core.prompts import PLAIN_STOP, PROMPT_FORMATS
from transforms.llm.requests import Sampling
from transforms.text.embedding_dedup import missing_dependencies
from transforms.text.seeds import default_seed_path, load_seeds
from transforms.text.selfmoe_graph import SelfmoeGraph, SelfmoeSettings



def _domains(c: dict) -> list[str]:
    return [d.strip() for d in c["domains"].split(",") if d.strip()]


def seed_files(c: dict) -> list[tuple[str, str]]:
    """(domain, seed file) per domain: SEEDS_DIR/<domain>.jsonl (a folder or a store prefix), or the
    packaged default."""
    files = []
    for domain in _domains(c):
        if c["seeds_dir"]:
            path = storage.join(c["seeds_dir"], f"{domain}.jsonl")
            if not storage.is_file(path):
                raise ConfigError(f"no seed file for domain {domain!r}: expected {path}")
        else:
            try:
                path = default_seed_path(domain)
            except (ValueError, FileNotFoundError) as exc:
                raise ConfigError(f"{exc} (or set seeds_dir to a folder with {domain}.jsonl)") from None
        files.append((domain, path))
    return files


def _check(c: dict) -> None:
    if not _domains(c):
        raise ConfigError("domains is empty: name at least one, e.g. knowledge,math")
    for domain, path in seed_files(c):
        try:
            seeds, _ = load_seeds(domain, path)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if not seeds:
            raise ConfigError(f"{path}: no usable seed for domain {domain!r}; each domain needs at least one")
    if c["embedding_threshold"] is not None:
        if missing_dependencies():
            raise ConfigError(f"embedding_threshold needs {', '.join(missing_dependencies())}: "
                              "pip install 'shardsmith[llm]'")
    check_llm(c)


CONFIG = ConfigSpec(check=_check, keys=(
    Key("domains", str, "knowledge,reasoning,math,coding", "comma-separated expert domains", gridable=False),
    Key("seeds_dir", str, None, "folder (or s3:// / gs:// prefix) of <domain>.jsonl seed files ({instruction, "
        "input, output} per line); default: the packaged seeds", optional=True, is_path=True, gridable=False),
    Key("per_domain", int, 8, "examples to keep per domain (the paper: about 5,000)", low=1),
    Key("k_shot", int, 4, "seeds shown in each brainstorm prompt", low=1),
    Key("demos", int, 2, "seed demonstrations before each instruction to answer", low=0),
    Key("tasks_per_prompt", int, 4, "new tasks expected from one brainstorm completion (plans the prompts)", low=1),
    Key("oversample", float, 3.0, "round 1 brainstorms this many times per_domain instructions (dedup and filters "
        "drop some)", low=1.0),
    Key("rounds", int, 4, "most brainstorm rounds per domain: each further round brainstorms for the domains still "
        "short of per_domain, as many prompts as the yield seen so far needs (at most 8x round 1's)", low=1),
    Key("threshold", float, 0.7, "drop an instruction whose ROUGE-L F against a kept one is >= this", 0.0, 1.0),
    Key("embedding_threshold", float, None, "also drop an instruction ROUGE-L kept whose all-MiniLM-L6-v2 cosine "
        "against a kept one is >= this (off by default: the paper uses ROUGE-L only)", 1e-6, 1.0, optional=True),
    Key("brainstorm_tokens", int, 192, "max tokens of a brainstorm completion", low=1),
    Key("response_tokens", int, 256, "max tokens of a response", low=1),
    Key("seed", int, 0, "seed of prompt sampling and generation", low=0),
    Key("prompt_format", str, "auto", "how responses are asked for: chat (the model's chat template), plain "
        "(an Alpaca-style text prompt with stop strings, for a base model) or auto (plain when the model's "
        "tokenizer has no chat template, else chat; a remote openai model counts as chat). Written on every "
        "row; the trainer formats its examples the same way", choices=PROMPT_FORMATS, gridable=False),
    *llm_keys(temperature=0.7, batch_size=16),
))


def tables(resolved: Resolved) -> dict[str, TableSpec]:
    return {"examples": TableSpec(schema.EXAMPLES)}


def settings(resolved: Resolved):
    """The graph's settings (transforms/text/selfmoe_graph.py) from the resolved config."""
    if len(resolved.grid) != 1:
        raise ConfigError(f"selfmoe runs one configuration at a time; these keys got lists: {resolved.swept}")
    c = resolved.grid[0]
    brainstorm = settings_from(Sampling, c, max_tokens=c["brainstorm_tokens"], stop=("\n\n\n",))
    backend = make_backend(c)
    try:
        prompt_format = backend.prompt_format(c["prompt_format"])
    except (ValueError, FileNotFoundError, ImportError) as exc:
        raise ConfigError(f"prompt_format: {exc}") from None
    # a base model answering a plain prompt runs on into a next "### Instruction:" block: stop there
    respond = settings_from(Sampling, c, max_tokens=c["response_tokens"],
                            stop=PLAIN_STOP if prompt_format == "plain" else ())
    return settings_from(SelfmoeSettings, c, seed_files=tuple(seed_files(c)), backend=backend, brainstorm=brainstorm,
                         respond=respond, cache_location=responses(c), prompt_format=prompt_format)


def build(pipeline, resolved: Resolved, ledger):
    return pipeline | "Selfmoe" >> SelfmoeGraph(settings(resolved), ledger)


def inputs(resolved: Resolved) -> dict[str, str]:
    return {f"seeds/{domain}": input_fingerprint(path) for domain, path in seed_files(resolved.values)}


class SelfMoE(Dataset):
    name = schema.DATASET
    summary = "Self-MoE self-specialization data per domain (brainstorm, ROUGE-L dedup, responses, filters)"
    config = CONFIG
    schemas = schema.TABLES
    trainer = "trainers.selfmoe.training:train"
    tables = staticmethod(tables)
    build = staticmethod(build)
    inputs = staticmethod(inputs)
    train_setup = staticmethod(base_model_setup)


DATASET = SelfMoE()
