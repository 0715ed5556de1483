"""The examples a Self-MoE expert trains on: each domain's kept rows, a held-out split by a stable hash
of the row id, and the SFT encoding in the format the data were generated in (chat template, or the
plain Alpaca-style prompt of a base model), the loss on the response only."""
from __future__ import annotations

import pyarrow.compute as pc
import torch

from core.prompts import plain_prompt
from trainers import lm
from trainers.data import hash_unit
from trainers.tables import DatasetError, read_arrow
from trainers.lm import IGNORE, collate


def split_rows(rows: list[dict], eval_fraction: float) -> tuple[list[dict], list[dict]]:
    """(train, eval) of one domain's rows: eval = hash(id) < eval_fraction, at least one of each
    when there are two rows or more (the lowest-hash row is moved to eval if none fell there)."""
    ranked = sorted(rows, key=lambda r: (hash_unit(r["id"]), r["id"]))
    ev = [r for r in ranked if hash_unit(r["id"]) < eval_fraction]
    if eval_fraction > 0 and not ev and len(ranked) > 1:
        ev = ranked[:1]
    if len(ev) == len(ranked) and len(ranked) > 1:
        ev = ev[:-1]
    ids = {r["id"] for r in ev}
    return [r for r in ranked if r["id"] not in ids], ev


def data_prompt_format(data_dir: str) -> str:
    """The prompt format the data were generated with (one per dataset: the pipeline writes it on
    every row); refuses a mix."""
    formats = set(read_arrow(data_dir, "examples", columns=["prompt_format"]).column("prompt_format").to_pylist())
    if len(formats) != 1:
        raise DatasetError(f"{data_dir}: expected one prompt_format in the examples, found {sorted(formats)}")
    return formats.pop()


def load_examples(data_dir: str, domains: list[str] | None = None) -> dict[str, list[dict]]:
    """Kept rows with a response, by domain (sorted). Refuses a domain without any."""
    table = read_arrow(data_dir, "examples", columns=["id", "domain", "instruction", "input", "response", "kept"])
    all_domains = sorted(set(table.column("domain").to_pylist()))
    if not all_domains:
        raise DatasetError(f"{data_dir}: the examples table has no rows; nothing to train")
    wanted = domains or all_domains
    unknown = sorted(set(wanted) - set(all_domains))
    if unknown:
        raise DatasetError(f"{data_dir}: no rows for domain(s) {unknown}; domains here: {all_domains}")
    kept = table.filter(pc.and_(pc.equal(table.column("kept"), True), pc.is_valid(table.column("response"))))
    by_domain: dict[str, list[dict]] = {d: [] for d in wanted}
    for row in kept.to_pylist():
        if row["domain"] in by_domain and row["response"].strip():
            by_domain[row["domain"]].append(row)
    empty = [d for d, rows in by_domain.items() if not rows]
    if empty:
        raise DatasetError(f"{data_dir}: domain(s) {empty} have no kept examples with a response, so "
                           f"no expert can be trained for them; regenerate the data or pass "
                           f"domains= without them")
    return dict(sorted(by_domain.items()))


def encode(tokenizer, row: dict, max_length: int, prompt_format: str = "chat") -> tuple[list[int], list[int]] | None:
    """(input_ids, labels) of one example in chat format (labels on the assistant turn only) or,
    for prompt_format plain, as the Alpaca-style text prompt the pipeline asked a base model with
    (core/prompts.plain_prompt, no demonstrations; labels on the response and EOS); None when
    truncation to max_length leaves no response token."""
    if prompt_format == "plain":
        return lm.encode_plain(tokenizer, plain_prompt(row["instruction"], row.get("input") or ""),
                               row["response"], max_length)
    user = row["instruction"] + (f"\n\n{row['input']}" if row.get("input") else "")
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": user}],
                                           add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template([{"role": "user", "content": user},
                                          {"role": "assistant", "content": row["response"]}], tokenize=False)
    if not full.startswith(prompt):
        raise DatasetError("the tokenizer's chat template does not render the prompt as a prefix of "
                           "the conversation; cannot mask the prompt tokens")
    p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    r_ids = tokenizer(full[len(prompt):], add_special_tokens=False)["input_ids"]
    ids, labels = (p_ids + r_ids)[:max_length], ([IGNORE] * len(p_ids) + r_ids)[:max_length]
    if all(x == IGNORE for x in labels):
        return None
    return ids, labels


def batches(examples: list, batch_size: int, pad_id: int) -> list[dict[str, torch.Tensor]]:
    return [collate(examples[i:i + batch_size], pad_id) for i in range(0, len(examples), batch_size)]


def encode_domains(data: dict[str, list[dict]], tokenizer, eval_fraction: float, max_length: int,
                   prompt_format: str) -> tuple[dict, dict]:
    """({domain: (train, eval) encoded examples}, {domain: counts}); a domain left without a
    train example is refused."""
    splits, sizes = {}, {}
    for d, rows in data.items():
        tr_rows, ev_rows = split_rows(rows, eval_fraction)
        tr = [e for e in (encode(tokenizer, r, max_length, prompt_format) for r in tr_rows) if e is not None]
        ev = [e for e in (encode(tokenizer, r, max_length, prompt_format) for r in ev_rows) if e is not None]
        if not tr:
            raise DatasetError(f"domain {d!r}: no train example left (kept {len(rows)}, eval "
                               f"{len(ev_rows)}, or cut away by max_length={max_length})")
        splits[d] = (tr, ev)
        sizes[d] = {"kept": len(rows), "train": len(tr), "eval": len(ev),
                    "cut_by_max_length": len(tr_rows) + len(ev_rows) - len(tr) - len(ev),
                    "eval_tokens": sum(sum(x != IGNORE for x in y) for _, y in ev)}
    return splits, sizes
