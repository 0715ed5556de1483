"""multiui samples -> model batches: lazy page screenshots, LLaVA conversations, answer-only labels.

Three pieces, used by trainers/multiui.py:

- `PageStore` finds a page's screenshot by id: the trainers' RowStore (trainers/rowstore.py) over
  the `id` and `screenshot` columns of `pages` (the HTML and the accessibility tree, most of a page
  row, are never read), row groups kept in an LRU bounded by bytes (`page_cache_mb`), each PNG
  decoded for each use. Memory trade-off: a PNG screenshot is ~0.1-1 MB while the decoded RGB
  image is W*H*3 bytes (~8 MB for 1280x2000), so caching the encoded bytes holds ~10x more pages
  for the price of one PNG decode per sample. Each DataLoader worker has its own store, and a miss
  costs the whole row group's screenshots in I/O: write `pages` with small row groups (tens of
  rows) for training.
- `Collator` turns (conversation, image) pairs into one padded batch: the chat text with the
  image placeholder (expanded by the processor into the model's image tokens), labels -100
  everywhere but the assistant (gpt) answers and the end-of-turn token right after each.
- `SampleBatches` streams `samples` with ShardDataset, drops held-out pages (or keeps only them),
  attaches images, and yields collated micro-batches that carry the `_stream`/`_offset` of every
  row they consumed (for Position) and counts of what was skipped and why.

Rows are skipped and counted, never fatal (docs/architecture.md, contract 4): missing_page (the
sample's page_id is not in `pages`), no_screenshot (the page row has a null screenshot), bad_image
(the PNG does not decode, or an element-OCR sample has no box inside it), bad_conversation (no gpt
turn, first turn not human, several <image>),
too_long (the prompt with its image tokens leaves no answer token within max_length). The trainer
fails when their share passes `max_skip_rate`.
"""
from __future__ import annotations

import io
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset

from core.marks import draw_mark
from schemas import multiui as schema
from trainers.data import OFFSET, STREAM, ShardDataset, hash_unit
from trainers.tables import DatasetError
from trainers.rowstore import RowStore

IGNORE = -100
SAMPLE_COLUMNS = ["id", "page_id", "task", "conversations", "box_px"]
LLAVA_IMAGE = "<image>"
ROLES = {"human": "user", "gpt": "assistant", "system": "system"}


def is_eval(page_id: str, eval_fraction: float) -> bool:
    """Held out by page: every sample of an eval page is held out (no page is seen in training and in eval)."""
    return hash_unit(page_id) < eval_fraction


# ------------------------------------------------------------------------------------ pages

class PageStore(RowStore):
    """Screenshot PNG bytes by page id, read lazily, row groups LRU-cached by bytes (one per process)."""

    STATS = {"cache_hits": "page_cache_hits", "cache_misses": "page_cache_misses",
             "row_groups_read": "page_row_groups_read", "bytes_read": "page_bytes_read"}

    def __init__(self, data_dir: str, cache_bytes: int):
        super().__init__(data_dir, "pages", ["id"], ["id", "screenshot"], cache_bytes=cache_bytes)

    def screenshots(self, page_ids: list[str]) -> dict[str, bytes | str]:
        """{page id: PNG bytes, or 'missing_page' / 'no_screenshot'}."""
        out: dict[str, bytes | str] = {}
        for (pid,), found in self.get_many((pid,) for pid in page_ids).items():
            png = found[0].column("screenshot")[found[1]].as_py() if found is not None else None
            out[pid] = png if png is not None else "no_screenshot" if found is not None else "missing_page"
        return out


def decode_image(png: bytes):
    from PIL import Image
    img = Image.open(io.BytesIO(png))
    img.load()
    return img.convert("RGB")


def sample_image(png: bytes, task: str, box_px):
    """The image a sample is about: its page's screenshot, with element OCR's red frame drawn on it.

    samples v2 store the frame's box instead of a framed copy of the page (schemas/multiui.py);
    the frame is core/marks.py's, the same the pipeline's pictures and `shardsmith
    export` use, so the model sees the pixels v1 stored. Raises ValueError for a marked task
    without a box inside the image (counted as bad_image)."""
    image = decode_image(png)
    if task in schema.MARKED_TASKS:
        try:
            draw_mark(image, box_px)
        except ValueError:
            raise ValueError(f"{task} sample without a box inside its {image.size} screenshot") from None
    return image


# ------------------------------------------------------------------------------------ collator

class EncodeError(ValueError):
    """A conversation this collator cannot turn into a training sequence (the reason is the message)."""


class Collator:
    """(LLaVA conversation, PIL image) pairs -> padded batch with answer-only labels.

    The chat text comes from the processor's chat template (content lists with one image item,
    so each model's own image placeholder is used) or, without one, the tokenizer's template with
    `processor.image_token` in the text. It is cut at the answers: the part before the first
    answer (which holds the image) goes through the processor, which expands the placeholder
    into the model's image tokens; the answers, each with the end-of-turn token that follows it
    in the chat text (eos), and the text between them are tokenized alone. So the labelled tokens
    decode exactly to the answers + eos.
    """

    def __init__(self, processor, max_length: int, padding_side: str = "right"):
        if padding_side not in ("left", "right"):
            raise DatasetError(f"padding_side {padding_side!r}: use left or right")
        self.processor, self.max_length, self.padding_side = processor, max_length, padding_side
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.image_token = getattr(processor, "image_token", None) or LLAVA_IMAGE
        self.eos = self.tokenizer.eos_token or ""
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.tokenizer.eos_token_id
        self.use_processor_template = bool(getattr(processor, "chat_template", None))

    # -- text
    def messages(self, conversations) -> list[dict]:
        """LLaVA turns -> chat messages; the one image goes where `<image>` was (first human turn
        when there is none)."""
        turns = [(ROLES.get(t["from"]), t["value"]) for t in conversations]
        if not turns or any(r is None for r, _ in turns):
            raise EncodeError("bad_conversation")
        if sum(v.count(LLAVA_IMAGE) for _, v in turns) > 1:
            raise EncodeError("bad_conversation")
        if not any(r == "assistant" for r, _ in turns) or \
                next(r for r, _ in turns if r != "system") != "user":
            raise EncodeError("bad_conversation")
        if not any(LLAVA_IMAGE in v for _, v in turns):
            i = next(i for i, (r, _) in enumerate(turns) if r == "user")
            turns[i] = ("user", LLAVA_IMAGE + "\n" + turns[i][1])
        msgs = []
        for role, value in turns:
            if LLAVA_IMAGE in value and role != "user":
                raise EncodeError("bad_conversation")
            if self.use_processor_template:
                before, _, after = value.partition(LLAVA_IMAGE) if LLAVA_IMAGE in value else (value, "", "")
                content = [{"type": "text", "text": before}] if before else []
                if LLAVA_IMAGE in value:
                    content.append({"type": "image"})
                    if after:
                        content.append({"type": "text", "text": after})
                msgs.append({"role": role, "content": content})
            else:
                msgs.append({"role": role, "content": value.replace(LLAVA_IMAGE, self.image_token)})
        return msgs

    def _render(self, msgs: list[dict], gen: bool = False) -> str:
        owner = self.processor if self.use_processor_template else self.tokenizer
        return owner.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)

    def pieces(self, conversations) -> list[tuple[str, bool]]:
        """The chat text cut into (text, is_answer) pieces; the first piece holds the image."""
        msgs = self.messages(conversations)
        full = self._render(msgs)
        cursor, spans = 0, []
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            answer = m["content"] if isinstance(m["content"], str) else \
                "".join(c.get("text", "") for c in m["content"])
            prefix = self._render(msgs[:i], gen=True)
            hint = len(prefix) if full.startswith(prefix) else cursor
            at = full.find(answer, max(hint, cursor))
            if at < 0 and answer.strip():
                answer = answer.strip()                      # templates that trim the content
                at = full.find(answer, max(hint, cursor))
            if at < 0 or not answer:
                raise EncodeError("bad_conversation")
            end = at + len(answer)
            if self.eos and full.startswith(self.eos, end):
                end += len(self.eos)
            spans.append((at, end))
            cursor = end
        out, pos = [], 0
        for a, b in spans:
            out += [(full[pos:a], False), (full[a:b], True)]
            pos = b
        if pos < len(full):
            out.append((full[pos:], False))
        if any(self.image_token in t for t, _ in out[1:]):
            raise EncodeError("bad_conversation")
        return out

    # -- tokens
    def _process(self, firsts: list[str], images: list) -> dict[str, Any]:
        return self.processor(text=firsts, images=[[im] for im in images], padding=True, return_tensors="pt")

    def __call__(self, items: list[tuple[Any, Any]]) -> tuple[dict[str, torch.Tensor] | None, list[int], Counter]:
        """items: (conversations, PIL image) -> (batch or None, indices of the items kept, skip counts)."""
        skipped: Counter = Counter()
        encoded: list[tuple[int, list[tuple[str, bool]], Any]] = []
        for i, (conv, image) in enumerate(items):
            try:
                encoded.append((i, self.pieces(conv), image))
            except EncodeError as exc:
                skipped[str(exc)] += 1
        while encoded:
            proc = self._process([p[0][0] for _, p, _ in encoded], [im for _, _, im in encoded])
            mask = proc["attention_mask"].bool()
            seqs, too_long = [], []
            for k, (_, pieces, _) in enumerate(encoded):
                ids = proc["input_ids"][k][mask[k]].tolist()
                first = len(ids)
                labels = [IGNORE] * first
                for text, is_answer in pieces[1:]:
                    more = self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
                    ids += more
                    labels += more if is_answer else [IGNORE] * len(more)
                ids, labels = ids[:self.max_length], labels[:self.max_length]
                if first >= self.max_length or all(x == IGNORE for x in labels):
                    too_long.append(k)
                seqs.append((ids, labels, first))
            if too_long:                    # re-run the processor without them (image inputs are per batch)
                skipped["too_long"] += len(too_long)
                encoded = [e for k, e in enumerate(encoded) if k not in set(too_long)]
                continue
            return self._assemble(proc, mask, seqs), [i for i, _, _ in encoded], skipped
        return None, [], skipped

    def _assemble(self, proc: dict, mask: torch.Tensor, seqs: list) -> dict[str, torch.Tensor]:
        n, width = len(seqs), max(len(ids) for ids, _, _ in seqs)
        per_token = [k for k, v in proc.items() if k not in ("input_ids", "attention_mask")
                     and isinstance(v, torch.Tensor) and v.shape == proc["input_ids"].shape]
        out = {"input_ids": torch.full((n, width), self.pad_id, dtype=torch.long),
               "attention_mask": torch.zeros((n, width), dtype=torch.long),
               "labels": torch.full((n, width), IGNORE, dtype=torch.long)}
        out.update({k: torch.zeros((n, width), dtype=proc[k].dtype) for k in per_token})
        for i, (ids, labels, first) in enumerate(seqs):
            sl = slice(0, len(ids)) if self.padding_side == "right" else slice(width - len(ids), width)
            out["input_ids"][i, sl] = torch.tensor(ids)
            out["labels"][i, sl] = torch.tensor(labels)
            out["attention_mask"][i, sl] = 1
            for k in per_token:              # e.g. token_type_ids: the processor's values, 0 on text after
                vals = torch.zeros(len(ids), dtype=proc[k].dtype)
                vals[:first] = proc[k][i][mask[i]][:first]
                out[k][i, sl] = vals
        for k, v in proc.items():
            if k not in out and k not in per_token:
                out[k] = v                   # pixel_values, image_sizes, pixel_attention_mask, ...
        return out


# ------------------------------------------------------------------------------------ stream

class SampleBatches(IterableDataset):
    """Collated micro-batches of `samples` for one epoch of a ShardDataset.

    keep='train' drops rows of held-out pages, keep='eval' keeps only those. Each item is
    {"inputs": batch or None, "ids", "tasks", "_stream", "_offset" (all rows consumed, for
    Position), "counts" (skips by reason, held_out, rows, page cache stats)}. A batch has up to
    `batch_size` rows that passed the held-out filter, fewer when some were skipped. Use with
    DataLoader(batch_size=None); each worker has its own PageStore copy.
    """

    def __init__(self, samples: ShardDataset, pages: PageStore, collator: Collator, batch_size: int,
                 keep: str = "train", eval_fraction: float = 0.0):
        super().__init__()
        if keep not in ("train", "eval"):
            raise ValueError(f"keep {keep!r}: use train or eval")
        self.samples, self.pages, self.collator = samples, pages, collator
        self.batch_size, self.keep, self.eval_fraction = batch_size, keep, eval_fraction

    def __iter__(self) -> Iterator[dict[str, Any]]:
        rows, streams, offsets, counts = [], [], [], Counter()
        for row in self.samples:
            streams.append(int(row[STREAM]))
            offsets.append(int(row[OFFSET]))
            counts["rows"] += 1
            if is_eval(row["page_id"], self.eval_fraction) != (self.keep == "eval"):
                counts["held_out" if self.keep == "train" else "train_rows"] += 1
                continue
            rows.append(row)
            if len(rows) == self.batch_size:
                yield self._batch(rows, streams, offsets, counts)
                rows, streams, offsets, counts = [], [], [], Counter()
        if streams:
            yield self._batch(rows, streams, offsets, counts)

    def _batch(self, rows: list[dict], streams: list[int], offsets: list[int], counts: Counter) -> dict:
        before = Counter(self.pages.stats)
        shots = self.pages.screenshots([r["page_id"] for r in rows]) if rows else {}
        items, kept_rows = [], []
        for r in rows:
            png = shots[r["page_id"]]
            if isinstance(png, str):
                counts[png] += 1             # missing_page / no_screenshot
                continue
            try:
                image = sample_image(png, r["task"], r.get("box_px"))
            except Exception:                # PIL raises several types for broken files; a box off the image
                counts["bad_image"] += 1
                continue
            items.append((r["conversations"], image))
            kept_rows.append(r)
        inputs, kept, skipped = self.collator(items) if items else (None, [], Counter())
        counts.update(skipped)
        counts.update({name: self.pages.stats[k] - before[k] for k, name in PageStore.STATS.items()})
        rows = [kept_rows[i] for i in kept]
        return {"inputs": inputs, "ids": [r["id"] for r in rows], "tasks": [r["task"] for r in rows],
                STREAM: streams, OFFSET: offsets, "counts": dict(counts)}


SKIP_REASONS = ("missing_page", "no_screenshot", "bad_image", "bad_conversation", "too_long")
