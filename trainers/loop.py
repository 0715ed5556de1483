"""What every trainer's loop shares: the device, the base model, and checkpoints.

A checkpoint is a folder `OUT/checkpoints/step-NNNNNNNN/` holding the model (written by the
trainer's own `write_model`), `optimizer.pt` (optimizer state and RNG states) and
`trainer_state.json` (step, data position, metrics so far). It is written to `step-N.tmp` and
renamed, so a crash never leaves a half checkpoint that a resume would pick up.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Callable, Optional

import torch

from trainers.data import DatasetError

CKPT_DIR, STATE_FILE, OPTIM_FILE = "checkpoints", "trainer_state.json", "optimizer.pt"


def pick_device(name: Optional[str], error: type = DatasetError) -> torch.device:
    """cuda when available unless `name` says otherwise; a clear error for a device that is not there."""
    name = name or ("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise error(f"device {name!r}: use cpu or cuda")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise error("device cuda requested but torch sees no CUDA device")
    return torch.device(name)


def check_base_model(path: Optional[str], error: type = DatasetError) -> str:
    if not path:
        raise error("base_model is not set: pass base_model=<local Hugging Face model folder>")
    if not os.path.isdir(path) or not os.path.isfile(os.path.join(path, "config.json")):
        raise error(f"base_model {path!r} is not a Hugging Face model folder "
                    f"(no {os.path.join(path, 'config.json')})")
    return os.path.abspath(path)


def load_base(path: str, device: torch.device):
    """A causal LM to adapt: bf16 weights on cuda, float32 on cpu, no KV cache (training)."""
    from transformers import AutoModelForCausalLM
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.config.use_cache = False
    return model.to(device)


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def latest_checkpoint(out_dir: str) -> Optional[str]:
    """The newest finished checkpoint folder under out_dir/checkpoints, or None."""
    root = os.path.join(out_dir, CKPT_DIR)
    if not os.path.isdir(root):
        return None
    done = sorted(d for d in os.listdir(root)
                  if d.startswith("step-") and not d.endswith(".tmp")
                  and os.path.isfile(os.path.join(root, d, STATE_FILE)))
    return os.path.join(root, done[-1]) if done else None


def save_checkpoint(out_dir: str, write_model: Callable[[str], None], optimizer, state: dict, keep: int) -> str:
    """Write a checkpoint for state["step"]; keep the newest `keep` (0: all). Returns its folder."""
    root = os.path.join(out_dir, CKPT_DIR)
    final = os.path.join(root, checkpoint_name(state["step"]))
    tmp = final + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    write_model(tmp)
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save({"optimizer": optimizer.state_dict(), "rng": rng, "step": state["step"]},
               os.path.join(tmp, OPTIM_FILE))
    with open(os.path.join(tmp, STATE_FILE), "w") as fh:
        json.dump(state, fh, indent=1)
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    if keep:
        steps = sorted(d for d in os.listdir(root) if d.startswith("step-") and not d.endswith(".tmp"))
        for old in steps[:-keep]:
            shutil.rmtree(os.path.join(root, old), ignore_errors=True)
    return final
