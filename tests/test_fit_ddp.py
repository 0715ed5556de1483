"""trainers/fit.py data parallel on CPU: two gloo processes against one process with the doubled batch.

The recipe is the smallest there is (a linear model on pruned-synth rows read with ShardDataset), so
the two processes start once for the module and the whole file takes seconds beyond that start.
Each trainer's own `--nproc 2` test lives in its test module and takes MINI_TOLERANCE from here;
the LoRA trainers' ones train `tiny_causal_lm`.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from torch.utils.data import DataLoader

from pipelines.cli import main
from tests.test_trainer_data import write_dataset
from trainers import distributed
from trainers.data import ShardDataset, collate_rows, epochs
from trainers.fit import Loss, Plan, Recipe, fit

# the tests that use these fixtures train or load a model; the rest are unit tests
FIXTURE_MARKS = {"runs": "model"}

LAYOUT = [[8, 8], [8, 8]]           # 32 rows in four row groups
STEPS, LR = 8, 0.05                 # mini-batch runs: two epochs
MINI_TOLERANCE = 0.05               # relative: same rows per epoch, grouped into other steps


def tiny_causal_lm(tokenizer_dir: str, folder: str) -> str:
    """A randomly initialised one-layer Llama, 16 wide, with the tokenizer (and chat template) of
    `tokenizer_dir`, saved to `folder` as a base_model for the LoRA trainers (selfmoe, rmaxts): their
    data-parallel tests compare two runs in seconds, where SmolLM2 would take minutes."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         tie_word_embeddings=True, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def lora_weights(adapter_dir: str) -> dict[str, torch.Tensor]:
    """The tensors of a saved peft adapter."""
    from safetensors.torch import load_file
    return load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))


def assert_same_update(two: dict[str, torch.Tensor], one: dict[str, torch.Tensor], moved: float,
                       share: float = 1e-3) -> None:
    """The weights two processes trained are the ones one process trained with their doubled batch:
    apart by less than `share` of `moved`, how far training moved them (> 0). Adam's steps are near
    lr x sign(gradient) per weight, so had a rank's gradient been lost, the half batch's update
    would move the weights as far but elsewhere, and fail this."""
    assert set(two) == set(one)
    apart = sum(float((two[k] - one[k]).norm()) ** 2 for k in one) ** 0.5
    assert moved > 0 and apart < share * moved, (apart, moved)


class Linear(Recipe):
    """Least squares of y_observed on x / 25; the loss is summed over rows (count: rows)."""

    def __init__(self, root: str, batch_size: int):
        self.root, self.batch_size = root, batch_size

    def build(self, checkpoint, device):
        model = torch.nn.Linear(3, 1)
        if checkpoint:
            model.load_state_dict(torch.load(os.path.join(checkpoint, "model.pt"), weights_only=True))
        return model.to(device)

    def save(self, model, folder):
        torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
        open(os.path.join(folder, f"saved-by-rank-{distributed.rank_and_world()[0]}"), "w").close()

    def batches(self, state, metrics):
        def open_epoch(epoch, resume):
            ds = ShardDataset(self.root, "rows", columns=["id", "x", "y_observed"], shuffle=True, seed=0,
                              epoch=epoch, resume=resume)
            return ds, DataLoader(ds, batch_size=self.batch_size, collate_fn=collate_rows)
        return epochs(open_epoch, state)

    def loss(self, model, batch):
        err = ((model(batch["x"] / 25).squeeze(-1) - batch["y_observed"].float()) ** 2).sum()
        return Loss(err, len(batch["id"]), {"rows": list(batch["id"]), "examples": len(batch["id"])})

    def evaluate(self, model):
        batch = collate_rows(list(ShardDataset(self.root, "rows", columns=["x", "y_observed"], rank=0, world_size=1)))
        return {"mse": float(((model(batch["x"] / 25).squeeze(-1) - batch["y_observed"].float()) ** 2).mean())}


def _plan(steps: int, **kw) -> Plan:
    return Plan(max_steps=steps, lr=LR, device="cpu", seed=0, keep_checkpoints=0, **kw)


def _runs(root: str, out: str, world: int) -> dict:
    """Full batch (one step = one epoch) and mini-batch runs, batch per process = 32 or 8 rows / world."""
    full = fit(Linear(root, 32 // world), _plan(3), os.path.join(out, "full"))[1]
    mini = fit(Linear(root, 8 // world), _plan(STEPS, checkpoint_every=2), os.path.join(out, "mini"))[1]
    return {"full": full, "mini": mini}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("rows"))
    write_dataset(root, LAYOUT)
    out = str(tmp_path_factory.mktemp("fit"))
    one = _runs(root, os.path.join(out, "one"), 1)
    two = distributed.launch(_runs, 2, root, os.path.join(out, "two"), 2, device="cpu")
    return root, out, one, two


def test_two_processes_train_like_one_with_the_doubled_batch(runs):
    _, _, one, two = runs
    assert two["full"]["world_size"] == 2 and one["full"]["world_size"] == 1
    # full batch: every step sees the same rows, so the steps are the same up to float summation order
    assert two["full"]["train"]["loss"] == pytest.approx(one["full"]["train"]["loss"], rel=1e-5)
    assert two["full"]["eval"][-1]["mse"] == pytest.approx(one["full"]["eval"][-1]["mse"], rel=1e-5)
    # mini-batches: each rank reads its half of the epoch, so the same rows go into other steps
    a, b = one["mini"]["train"], two["mini"]["train"]
    assert a["examples"] == b["examples"] == [8] * STEPS        # the global batch: 8 rows either way
    for epoch in (slice(0, 4), slice(4, 8)):                   # each epoch: every row once, on both
        assert sorted(r for step in a["rows"][epoch] for r in step) == \
            sorted(r for step in b["rows"][epoch] for r in step) and len({r for s in b["rows"][epoch] for r in s}) == 32
    assert a["loss"][-1] < a["loss"][0] and b["loss"][-1] < b["loss"][0]
    assert two["mini"]["eval"][-1]["mse"] == pytest.approx(one["mini"]["eval"][-1]["mse"], rel=MINI_TOLERANCE)
    assert b["loss"][-1] == pytest.approx(a["loss"][-1], rel=MINI_TOLERANCE)


def test_checkpoints_are_written_by_rank_0_only(runs):
    _, out, _, two = runs
    root = os.path.join(out, "two", "mini", "checkpoints")
    assert sorted(os.listdir(root)) == [f"step-{s:08d}" for s in (2, 4, 6, 8)]
    for step in os.listdir(root):
        assert sorted(f for f in os.listdir(os.path.join(root, step)) if f.startswith("saved-by")) == ["saved-by-rank-0"]
    assert two["mini"]["checkpoints"][-1].endswith("step-00000008")


def test_resume_on_another_process_count(runs, tmp_path):
    """The two-process checkpoint of step 2 (mid-epoch: 16 of 32 rows done) resumes on one process:
    the rest of that epoch is exactly the rows the two processes had not read."""
    root, out, _, two = runs
    resumed = str(tmp_path / "resumed")
    shutil.copytree(os.path.join(out, "two", "mini", "checkpoints", "step-00000002"),
                    os.path.join(resumed, "checkpoints", "step-00000002"))
    _, m = fit(Linear(root, 8), _plan(STEPS, checkpoint_every=2), resumed)
    tr, first = m["train"], two["mini"]["train"]
    assert m["resumed_from"].endswith("step-00000002") and tr["step"] == list(range(1, STEPS + 1))
    assert tr["rows"][:2] == first["rows"][:2]                  # carried over from the checkpoint
    epoch0 = [r for step in tr["rows"][:4] for r in step]
    assert sorted(epoch0) == sorted(set(epoch0)) and len(epoch0) == 32
    assert m["eval"][-1]["mse"] == pytest.approx(two["mini"]["eval"][-1]["mse"], rel=MINI_TOLERANCE)


def test_nproc_misuse_is_one_line(tmp_path, capsys):
    write_dataset(tmp_path / "data", LAYOUT)
    for argv, expected in ((["--nproc", "0"], "--nproc must be at least 1, got 0"),
                           (["--nproc", "2"], "the pruned-synth trainer runs on one process: drop --nproc")):
        assert main(["train", "pruned-synth", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "t")] + argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expected in err, err


@pytest.mark.model
def test_processes_see_the_callers_path_folder_and_environment(tmp_path, monkeypatch):
    """The processes fork from a server that may have started long before, elsewhere: a function
    whose module is on a sys.path entry added since, the working folder and a variable set since
    all reach them as the caller has them now."""
    distributed.launch(os.getcwd, 2)                       # the server is running from here on
    module = tmp_path / "lib" / "ddp_probe_module.py"
    module.parent.mkdir()
    module.write_text("import os\n\ndef probe(tag):\n"
                      "    return tag, __file__, os.getcwd(), os.environ['DDP_PROBE'], os.environ['RANK']\n")
    monkeypatch.syspath_prepend(str(module.parent))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DDP_PROBE", "set-after-start")
    import ddp_probe_module
    out = distributed.launch(ddp_probe_module.probe, 2, "x")
    assert out == ("x", str(module), str(tmp_path), "set-after-start", "0")


def mark_call(path):
    """A launched fn that leaves a mark per process that ran it."""
    with open(path, "a") as fh:
        fh.write(".")
    return os.getpid()


@pytest.mark.model
def test_a_group_that_cannot_form_is_tried_once_more_from_a_fresh_rendezvous(tmp_path, monkeypatch, caplog):
    """Forming the group is the one step retried (gloo's mesh can fail to connect on a busy machine,
    and nothing has trained yet); each try gets a rendezvous of its own. A group that cannot form
    on any of the tries raises its processes' own error, and fn never ran."""
    real = distributed._rendezvous
    given = []

    def first_broken(folder):   # the first rendezvous is one torch cannot join
        given.append(real(folder) if given else "nojoin://rendezvous")
        return given[-1]
    monkeypatch.setattr(distributed, "_rendezvous", first_broken)
    calls = tmp_path / "calls"
    with caplog.at_level("WARNING", logger="trainers.distributed"):
        assert distributed.launch(mark_call, 2, str(calls)) > 0
    assert len(given) == 2 and given[0] != given[1]
    assert calls.read_text() == ".."   # once per process, on the second try only
    assert "could not form their group" in caplog.text and "trying again (2 of 3)" in caplog.text

    monkeypatch.setattr(distributed, "_rendezvous", lambda folder: "nojoin://rendezvous")
    calls.unlink()
    with pytest.raises(Exception) as raised:
        distributed.launch(mark_call, 2, str(calls))
    assert "No rendezvous handler for nojoin://" in str(raised.value) and not calls.exists()


KILLED_LAUNCHER = """
import os, sys, time
from trainers import distributed

def train(marks):
    open(f"{marks}.{os.environ['RANK']}", "w").close()
    time.sleep(300)

if __name__ == "__main__":
    distributed.launch(train, 2, sys.argv[1])
"""


@pytest.mark.model
def test_a_killed_launcher_takes_its_training_processes_with_it(tmp_path):
    """SIGKILL to the process that launched two training processes (as a cluster ends a preempted
    worker: no teardown runs) ends them, and the fork server they came from, within seconds."""
    from tests.processes import descendants, left_after
    script = tmp_path / "launcher.py"
    script.write_text(KILLED_LAUNCHER)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    job = subprocess.Popen([sys.executable, str(script), str(tmp_path / "rank")], env=env, cwd=tmp_path,
                           start_new_session=True)
    deadline = time.time() + 120
    while not all((tmp_path / f"rank.{r}").exists() for r in (0, 1)) and time.time() < deadline and job.poll() is None:
        time.sleep(0.05)
    started = descendants(job.pid)
    assert job.poll() is None and len(started) >= 3, f"the two processes did not start: {started}"
    os.kill(job.pid, signal.SIGKILL)
    job.wait()
    left = left_after(started)
    assert not left, f"processes of the killed launcher are still running: {left}"
