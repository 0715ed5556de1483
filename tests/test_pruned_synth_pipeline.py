"""pruned-synth end to end: run -> validate -> train, dead letters, overwrite, stable ids."""
import hashlib
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines import registry, run
from core.config import ConfigError
from pipelines.validate import validate
from tests.conftest import parquet_digests, read_manifest, read_rows, read_table, table_files
from trainers import pruned_synth as trainer
from trainers import rmt
from transforms.io.shards import num_parts, payload_bytes

pytestmark = pytest.mark.pipeline

SMALL = ["p=40", "n=100", "n_hat=60", "m=1500", "n_test=600"]
PART_MB = 0.105  # 2,200 rows of p=40 are about 479 KB of payload: five parts of at most 110 KB


def test_run_validate_train(run_dataset, tmp_path):
    path, manifest = run_dataset("pruned-synth", *SMALL, "epsilon=[0.1,0.5]", part_mb=PART_MB)
    rows = manifest["tables"]["rows"]
    assert rows["rows"] == 2 * (100 + 1500 + 600)
    assert rows["splits"] == {"real": 200, "synthetic": 3000, "test": 1200}
    # the part count follows the volume: about 957 KB of payload at 110 KB a part
    payload = sum(payload_bytes(pq.read_table(f)) for f in table_files(path, "rows", manifest))
    assert len(rows["files"]) == num_parts(payload, int(PART_MB * 2**20)) == 9
    assert manifest["tables"]["experiments"]["rows"] == 2
    assert len(manifest["tables"]["experiments"]["files"]) == 1
    assert manifest["dead_letters"]["count"] == 0
    assert set(manifest["stages"]) == {"unique_experiments", "real_rows", "generator", "synthetic_rows"}
    assert "skipped" not in manifest["stages"]["unique_experiments"]      # no experiment repeated
    assert manifest["swept"] == ["epsilon"] and manifest["experiments"] == 2
    assert manifest["config"]["epsilon"] == [0.1, 0.5]
    # published: the manifest, the card and one generation, with no spill files or run record left
    generation = manifest["generation"]
    assert sorted(os.listdir(tmp_path / "out")) == ["pruned-synth"]
    assert sorted(os.listdir(path)) == ["README.md", "_manifest.json", generation]
    assert sorted(os.listdir(os.path.join(path, generation))) == ["_dead_letter", "experiments", "rows"]
    problems, _ = validate(path)
    assert problems == []

    metrics = trainer.train(path, str(tmp_path / "train"), {})
    assert [e["params"]["epsilon"] for e in metrics["experiments"]] == [0.1, 0.5]
    for e in metrics["experiments"]:
        assert e["rows"]["real"] == 100 and e["rows"]["synthetic"] == 1500 and e["rows"]["test"] == 600
        assert 0.5 < e["empirical_accuracy"] < 1
        assert abs(e["empirical_accuracy"] - e["theoretical_accuracy"]) < 0.06
    assert (tmp_path / "train" / "accuracy.png").exists()


def test_rows_follow_the_model(run_dataset):
    path, _ = run_dataset("pruned-synth", *SMALL, "epsilon=0.3", "phi=0.9", "rho=0.2", part_mb=PART_MB)
    table = read_table(path, "rows")
    synth = table.filter(pa.compute.equal(table.column("source"), "synthetic")).to_pylist()
    flipped = np.array([r["y_true"] != r["y_observed"] for r in synth])
    kept = np.array([r["kept"] for r in synth])
    assert abs(flipped.mean() - 0.3) < 0.04
    assert abs(kept[~flipped].mean() - 0.9) < 0.04 and abs(kept[flipped].mean() - 0.2) < 0.06
    real = [r for r in table.to_pylist() if r["source"] == "real"]
    assert all(r["kept"] and r["y_true"] == r["y_observed"] and len(r["x"]) == 40 for r in real)
    assert all(r["kept"] is None for r in table.to_pylist() if r["source"] == "test")
    exp = read_rows(path, "experiments")[0]
    assert len(exp["mu_hat"]) == 40 and len(exp["cov_hat"]) == 40 * 40
    assert abs(exp["mu_hat"][0] - 1.0) < 0.5  # estimated from 60 rows of N(mu, I), mu = e_1


def test_same_config_same_ids_and_bytes(run_dataset, tmp_path):
    a, ma = run_dataset("pruned-synth", *SMALL, out=tmp_path / "a", part_mb=PART_MB)
    b, mb = run_dataset("pruned-synth", *SMALL, out=tmp_path / "b", part_mb=PART_MB)
    assert len(ma["tables"]["rows"]["files"]) == 5 and ma["generation"] != mb["generation"]
    assert parquet_digests(a) == parquet_digests(b)
    c, _ = run_dataset("pruned-synth", *SMALL, "seed=1", out=tmp_path / "c", part_mb=PART_MB)
    ids = lambda p: set(read_table(p, "rows", columns=["id"]).column("id").to_pylist())
    assert not ids(a) & ids(c)


def test_overwrite_replaces_the_dataset_whole(run_dataset, tmp_path):
    path, first = run_dataset("pruned-synth", *SMALL, part_mb=PART_MB)
    assert len(first["tables"]["rows"]["files"]) == 5
    with pytest.raises(ConfigError, match="exists: pass --overwrite"):
        run_dataset("pruned-synth", *SMALL)
    stray = os.path.join(path, first["generation"], "rows", "part-00099-of-00100.parquet")
    open(stray, "wb").close()
    _, second = run_dataset("pruned-synth", *SMALL, overwrite=True)  # the default part size: one part
    assert len(second["tables"]["rows"]["files"]) == 1
    assert read_manifest(path) == second
    generation = second["generation"]
    assert generation != first["generation"]
    # the replaced generation is gone whole, stray file included: no staging or trash left
    assert sorted(os.listdir(path)) == ["README.md", "_manifest.json", generation]
    assert sorted(os.listdir(os.path.join(path, generation, "rows"))) == ["part-00000-of-00001.parquet"]
    assert validate(path)[0] == []
    assert sorted(os.listdir(tmp_path / "out")) == ["pruned-synth"]


def _features(tmp_path, rows=600, p=8, bad=()):
    rng = np.random.default_rng(0)
    y = rng.choice([-1, 1], size=rows)
    x = (y[:, None] * np.eye(p)[0] + rng.standard_normal((rows, p))).tolist()
    ys = y.tolist()
    for i, kind in bad:
        if kind == "short":
            x[i] = x[i][:-1]
        elif kind == "nan":
            x[i][2] = float("nan")
        elif kind == "label":
            ys[i] = 0
        elif kind == "null":
            x[i] = None
    path = tmp_path / "features.parquet"
    pq.write_table(pa.table({"x": x, "y": ys}), path)
    return str(path)


def test_corrupt_feature_rows_become_dead_letters(run_dataset, tmp_path):
    bad = [(3, "short"), (7, "nan"), (11, "label"), (13, "null")]
    features = _features(tmp_path, bad=bad)
    path, manifest = run_dataset("pruned-synth", f"features={features}", "n=400", "n_hat=200",
                                 "n_test=150", "m=500")
    assert manifest["dead_letters"]["count"] == 4
    assert manifest["dead_letters"]["by_stage"] == {"real_rows": 4}
    assert manifest["tables"]["rows"]["splits"] == {"real": 400, "synthetic": 500, "test": 150}
    assert manifest["inputs"]["features"].endswith(hashlib.sha256(open(features, "rb").read()).hexdigest())
    dead = read_rows(path, "_dead_letter")
    messages = sorted(d["message"] for d in dead)
    assert any("row 3: x has 7 values, expected p=8" in m for m in messages)
    assert any("row 7: x holds NaN" in m for m in messages)
    assert any("row 11: label 0 is not +1 or -1" in m for m in messages)
    assert any("row 13: x has None values" in m for m in messages)
    assert {d["stage"] for d in dead} == {"real_rows"}
    assert all(d["excerpt"] and d["error_type"] in ("BadFeatureRow", "BadLabel") for d in dead)
    # the valid rows are intact: the first 400 good rows of the file, in order, are the real rows
    table = pq.read_table(features).to_pylist()
    good = [r for i, r in enumerate(table) if i not in {3, 7, 11, 13}]
    rows = read_rows(path, "rows")
    real = sorted((r for r in rows if r["source"] == "real"), key=lambda r: r["index"])
    assert [r["y_true"] for r in real] == [g["y"] for g in good[:400]]
    assert np.allclose([r["x"] for r in real], [g["x"] for g in good[:400]], atol=1e-6)
    metrics = trainer.train(path, str(tmp_path / "t"), {})
    (e,) = metrics["experiments"]
    assert e["theoretical_accuracy"] is None and e["empirical_accuracy"] > 0.6


def test_too_many_dead_letters_fail_the_run_and_publish_nothing(run_dataset, tmp_path):
    features = _features(tmp_path, bad=[(i, "nan") for i in range(0, 60)])
    with pytest.raises(run.RunFailed) as err:
        run_dataset("pruned-synth", f"features={features}", "n=300", "n_hat=100", "n_test=100", "m=100")
    message = str(err.value)
    assert "stage 'real_rows' sent 60 of" in message and "above --max-error-rate 0.05" in message
    assert "nothing was published" in message
    # nothing published: no manifest or card for the dataset, only the failed run's own generation
    target = tmp_path / "out" / "pruned-synth"
    failed = err.value.location
    assert os.path.dirname(failed) == str(target) and os.path.basename(failed).startswith("run-")
    assert failed in message
    assert os.listdir(target) == [os.path.basename(failed)]
    with pytest.raises(FileNotFoundError, match="not a finished shardsmith dataset"):
        validate(str(target))
    failed_manifest = read_manifest(failed)
    assert "dead-letter share" in failed_manifest["failed"] and "real_rows" in failed_manifest["failed"]
    assert failed_manifest["dead_letters"]["count"] == 60
    assert len(read_rows(failed, "_dead_letter")) == 60
    path, manifest = run_dataset("pruned-synth", f"features={features}", "n=300", "n_hat=100",
                                 "n_test=100", "m=100", max_error_rate=0.2)
    assert manifest["dead_letters"]["count"] == 60
    assert not os.path.exists(failed)  # the next published run clears the failed generation
    assert sorted(os.listdir(path)) == ["README.md", "_manifest.json", manifest["generation"]]


def test_unusable_features_files_are_refused_up_front(tmp_path):
    dataset = registry.get("pruned-synth")
    pickled = tmp_path / "objects.npz"
    np.savez(pickled, x=np.array([[1.0], [2.0, 3.0]], dtype=object), y=np.array([1, -1]))
    with pytest.raises(ConfigError, match="Object arrays cannot be loaded"):  # never unpickled
        run.run(dataset, out=str(tmp_path), sets=[f"features={pickled}", "n=1", "n_hat=1", "n_test=1"])
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, features=np.zeros((3, 2)))
    with pytest.raises(ConfigError, match="needs arrays x and y"):
        run.run(dataset, out=str(tmp_path), sets=[f"features={wrong}", "n=1", "n_hat=1", "n_test=1"])
    csv = tmp_path / "f.csv"
    csv.write_text("1,2\n")
    with pytest.raises(ConfigError, match="must be a .parquet or .npz"):
        run.run(dataset, out=str(tmp_path), sets=[f"features={csv}", "n=1", "n_hat=1", "n_test=1"])
    few = tmp_path / "few.npz"
    np.savez(few, x=np.zeros((10, 3)), y=np.ones(10))
    with pytest.raises(ConfigError, match="has 10 rows, fewer than n \\+ n_test = 20"):
        run.run(dataset, out=str(tmp_path), sets=[f"features={few}", "n=10", "n_hat=5", "n_test=10"])


def test_learned_verifier_keeps_rows_it_agrees_with(run_dataset, tmp_path):
    path, _ = run_dataset("pruned-synth", *SMALL, "verifier=learned", "epsilon=0.3", "n=400")
    metrics = trainer.train(path, str(tmp_path / "t"), {})
    (e,) = metrics["experiments"]
    observed = e["verifier_observed"]
    assert observed["phi"] > 0.6 and observed["rho"] < 0.4  # it mostly rejects flipped labels
    assert "approximate" in e["theory_note"]


def test_fig4_phase_transition_matches_theory(run_dataset, tmp_path):
    """The paper's Fig. 4 via the pipeline and trainer: 20 seeds, within 2 points at every epsilon."""
    eps = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    path, manifest = run_dataset(
        "pruned-synth", "p=100", "n=0", "n_hat=0", "m=1000", "mu_norm=1", "gamma=1", "rho=0.3",
        "phi=0.8", "n_test=1000", f"epsilon={eps}", f"seed={list(range(20))}")
    assert manifest["experiments"] == 120
    metrics = trainer.train(path, str(tmp_path / "t"), {})
    assert metrics["x_axis"] == "epsilon"
    (curve,) = metrics["curves"]
    assert curve["x"] == eps and curve["seeds"] == [20] * 6
    for e, emp, th in zip(eps, curve["empirical_mean"], curve["theory"]):
        closed = rmt.synthetic_only_theory(100, 1000, 1.0, e, 0.3, 0.8, 1.0)["accuracy"]
        assert th == pytest.approx(closed)
        assert abs(emp - th) < 0.02, (e, emp, th)
    accuracy = dict(zip(eps, curve["theory"]))
    assert accuracy[0.0] > 0.8 and accuracy[0.8] < 0.5 and accuracy[1.0] < 0.25


def test_npz_features_and_streaming_the_shards_into_torch(run_dataset):
    """A .npz features file end to end, then the shards streamed by trainers/data.py with workers."""
    import tempfile

    import torch

    from trainers.data import ShardDataset, collate_rows

    rng = np.random.default_rng(3)
    y = rng.choice([-1, 1], size=300)
    x = y[:, None] * np.eye(5)[0] + rng.standard_normal((300, 5))
    with tempfile.TemporaryDirectory() as tmp:
        features = os.path.join(tmp, "f.npz")
        np.savez(features, x=x, y=y)
        path, manifest = run_dataset("pruned-synth", f"features={features}", "n=200", "n_hat=100",
                                     "n_test=100", "m=700", part_mb=0.02)
    assert manifest["tables"]["rows"]["splits"] == {"real": 200, "synthetic": 700, "test": 100}
    assert len(manifest["tables"]["rows"]["files"]) == 4  # about 78 KB of payload at 21 KB a part
    ds = ShardDataset(path, "rows", columns=["id", "x", "y_observed"], split="synthetic")
    loader = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=2, collate_fn=collate_rows)
    seen = [i for batch in loader for i in batch["id"]]
    assert len(seen) == len(set(seen)) == 700
    first = next(iter(torch.utils.data.DataLoader(ds, batch_size=8, collate_fn=collate_rows)))
    assert first["x"].shape == (8, 5) and first["x"].dtype == torch.float32
