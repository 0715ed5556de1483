"""What the LoRA trainers (selfmoe, rmaxts) share: the base model, padded batches, the token loss.

Examples are formatted with the tokenizer's chat template, or as plain text for a base model
without one (`prompt_format`: the trainer follows what the data record, see resolve_prompt_format).
Examples are (input_ids, labels) pairs with labels -100 (IGNORE) where no loss is taken (prompt,
padding); the loss is the summed NLL over label tokens with their count, so `fit` takes one token
mean over a whole accumulated step, across processes too.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from core.config import ConfigError, Key
from core.prompts import PROMPT_FORMATS
from trainers.fit import Loss

IGNORE = -100
DEFAULT_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
Example = tuple[list[int], list[int]]


def lora_keys(*, r: int, alpha: float, what: str) -> tuple[Key, ...]:
    """base_model and the LoRA keys, with a trainer's defaults."""
    return (Key("base_model", str, None, f"local Hugging Face causal-LM folder {what} (the CLI fills it with "
                "the model that wrote the data)", optional=True, gridable=False),
            Key("lora_r", int, r, "LoRA rank", low=1, gridable=False),
            Key("lora_alpha", float, alpha, "LoRA alpha (scaling alpha / r)", low=0.0, gridable=False),
            Key("lora_dropout", float, 0.0, "LoRA dropout while training", low=0.0, high=1.0, gridable=False),
            Key("target_modules", str, DEFAULT_TARGETS, "comma-separated names of the adapted linear layers",
                gridable=False))


@dataclass(frozen=True)
class LoraSettings:
    """What lora_keys set: a LoRA trainer's settings extend it (core.config.settings_from fills them)."""

    base_model: str | None
    lora_r: int
    lora_alpha: float
    lora_dropout: float
    target_modules: str


def lora_config(s: LoraSettings):
    from peft import LoraConfig
    targets = [t.strip() for t in s.target_modules.split(",") if t.strip()]
    return LoraConfig(r=s.lora_r, lora_alpha=s.lora_alpha, lora_dropout=s.lora_dropout,
                      target_modules=targets, bias="none", task_type="CAUSAL_LM")


def lora_model(s: LoraSettings, checkpoint: str | None, device: torch.device):
    """The base model with a trainable LoRA adapter: the checkpoint's to resume, else a fresh one."""
    from peft import PeftModel, get_peft_model
    base = load_base(s.base_model, device)
    if checkpoint:
        return PeftModel.from_pretrained(base, checkpoint, is_trainable=True)
    return get_peft_model(base, lora_config(s))


def check_base_model(path: str | None) -> str:
    if not path:
        raise ConfigError("base_model is not set: pass base_model=<local Hugging Face model folder>")
    if not os.path.isdir(path) or not os.path.isfile(os.path.join(path, "config.json")):
        raise ConfigError(f"base_model {path!r} is not a Hugging Face model folder "
                          f"(no {os.path.join(path, 'config.json')})")
    return os.path.abspath(path)


def load_base(path: str, device: torch.device):
    """A causal LM to adapt: bf16 weights on cuda, float32 on cpu, no KV cache (training)."""
    from transformers import AutoModelForCausalLM
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.config.use_cache = False
    return model.to(device)


def prompt_format_key(what: str) -> Key:
    return Key("prompt_format", str, "auto", f"how training examples are formatted: auto (as the data records "
               f"{what}), chat (the tokenizer's chat template) or plain (the Alpaca-style text prompt of a "
               f"base model); it must match how the data were generated", choices=PROMPT_FORMATS,
               gridable=False)


def resolve_prompt_format(requested: str, recorded: str | None, tokenizer) -> str:
    """The format to train in: the data's (`recorded`; None when the data do not say: then by the
    tokenizer, plain without a chat template), checked against `requested` and the tokenizer."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    fmt = recorded or ("chat" if has_template else "plain")
    if requested != "auto" and requested != fmt:
        raise ConfigError(f"prompt_format={requested}, but the data were generated with {fmt} prompts; the "
                          f"trainer formats examples as they were generated: drop prompt_format (auto) or "
                          f"regenerate the data with prompt_format={requested}")
    if fmt == "chat" and not has_template:
        raise ConfigError("the data were generated with chat prompts but the base model's tokenizer has no chat "
                          "template: train the model that wrote the data (base_model=) or regenerate the data "
                          "with prompt_format=plain")
    return fmt


def encode_plain(tokenizer, prompt: str, response: str, max_length: int) -> Example | None:
    """(input_ids, labels) of a plain-completion example: the prompt text as the backend sends it
    (tokenized with the tokenizer's special tokens, e.g. BOS), then the response and the
    end-of-sequence token, labels on those only; None when max_length leaves no response token."""
    p_ids = list(tokenizer(prompt)["input_ids"])
    r_ids = list(tokenizer(response.strip(), add_special_tokens=False)["input_ids"])
    if tokenizer.eos_token_id is not None:
        r_ids.append(tokenizer.eos_token_id)
    ids, labels = (p_ids + r_ids)[:max_length], ([IGNORE] * len(p_ids) + r_ids)[:max_length]
    if all(x == IGNORE for x in labels):
        return None
    return ids, labels


def pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def collate(examples: list[Example], pad: int) -> dict[str, torch.Tensor]:
    """Right-padded batch: input_ids, attention_mask, labels (-100 on padding)."""
    n = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), n), pad, dtype=torch.long)
    labels = torch.full((len(examples), n), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(examples), n), dtype=torch.long)
    for i, (x, y) in enumerate(examples):
        ids[i, :len(x)], labels[i, :len(y)], mask[i, :len(x)] = torch.tensor(x), torch.tensor(y), 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def nll_sum(model, batch: dict) -> tuple[torch.Tensor, int]:
    """(summed token NLL over label tokens, label token count), in float32."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    target = batch["labels"][:, 1:]
    keep = target != IGNORE
    loss = F.cross_entropy(logits[:, :-1][keep].float(), target[keep], reduction="sum")
    return loss, int(keep.sum())


def token_loss(model, batch: dict) -> Loss:
    """A micro-batch's Loss for `fit`: label tokens counted, all tokens logged for tokens/s."""
    total, n = nll_sum(model, batch)
    return Loss(total, n, {"label_tokens": n, "tokens": int(batch["attention_mask"].sum())})
