"""Every misuse prints one line naming the problem and exits 2, without a traceback."""
import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from tests.conftest import table_files
from transforms.io.shards import num_parts, payload_bytes

PART_MB = "0.08"  # 450 rows of p=100, about 206 KB of payload: three parts


# the tests that use `small_dataset` run a pipeline first (once for the module)
FIXTURE_MARKS = {"small_dataset": "pipeline"}


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "out"
    assert main(["run", "pruned-synth", "--out", str(out), "--set", "m=300", "--set", "n=50",
                 "--set", "n_hat=50", "--set", "n_test=100", "--part-mb", PART_MB]) == 0
    return out / "pruned-synth"


def _one_line_error(capsys, argv, code=2):
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("argv, expected", [
    (["run", "no-such-dataset"], "unknown dataset 'no-such-dataset'; known: concretizer, multiui, pruned-synth"),
    (["run", "pruned-synth", "--set", "epsilonn=0.2"], "unknown key 'epsilonn' (did you mean 'epsilon'?)"),
    (["run", "pruned-synth", "--set", "m=many"], "key 'm' expects an int, got 'many'"),
    (["run", "pruned-synth", "--set", "rho=1.5"], "key 'rho' must be in [0, 1], got 1.5"),
    (["run", "pruned-synth", "--set", "phi=[0.5,2]"], "key 'phi' must be in [0, 1], got 2.0"),
    (["run", "pruned-synth", "--config", "/no/such.yaml"], "config file '/no/such.yaml' not found"),
    (["run", "pruned-synth", "--set", "features=/no/such.parquet"], "file '/no/such.parquet' not found"),
    (["run", "pruned-synth", "--runner", "spark"], "unknown runner 'spark'"),
    (["run", "pruned-synth", "--max-error-rate", "2"], "--max-error-rate must be in [0, 1], got 2.0"),
    (["run", "pruned-synth", "--part-mb", "0"], "--part-mb must be positive, got 0"),
    (["run", "pruned-synth", "--set", "rows_per_shard=10"], "unknown key 'rows_per_shard'"),
    (["run"], "the following arguments are required: dataset"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["train", "no-such-dataset", "--data", "."], "unknown dataset 'no-such-dataset'"),
    (["train", "pruned-synth", "--data", "/no/such/folder"], "--data '/no/such/folder' is not a folder"),
    (["validate", "/no/such/folder"], "not found: /no/such/folder is not a finished shardsmith dataset"),
    (["inspect", "/no/such/folder"], "not a finished shardsmith dataset"),
    (["view", "/no/such/folder", "--port", "99999"], "--port 99999: a port is 0 to 65535"),
    (["view", "/no/such/folder", "--port", "-1"], "--port -1: a port is 0 to 65535"),
])
def test_misuse_is_one_line_exit_2(capsys, tmp_path, argv, expected):
    if argv[:1] == ["run"] and len(argv) > 1:
        argv = argv + ["--out", str(tmp_path)]  # never touch ./out
    err = _one_line_error(capsys, argv)
    assert err.startswith("shardsmith: error: ")
    assert expected in err


def test_train_misuse_on_real_data(capsys, small_dataset):
    err = _one_line_error(capsys, ["train", "pruned-synth", "--data", str(small_dataset), "--set", "gama=2"])
    assert "unknown key 'gama' (did you mean 'gamma'?)" in err
    err = _one_line_error(capsys, ["train", "pruned-synth", "--data", str(small_dataset), "--set", "gamma=-1"])
    assert "key 'gamma' must be in" in err
    err = _one_line_error(capsys, ["train", "pruned-synth", "--data", str(small_dataset), "--trainer", "backbone"])
    assert "--trainer 'backbone': pruned-synth has no such trainer (named trainers: none besides the default)" in err


def test_rerun_without_overwrite_is_refused(capsys, small_dataset):
    err = _one_line_error(capsys, ["run", "pruned-synth", "--out", str(small_dataset.parent)])
    assert "exists: pass --overwrite to replace it" in err


def test_list_run_validate_inspect_train(capsys, small_dataset, tmp_path):
    assert main(["list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == ["pruned-synth", "selfmoe", "multiui", "rmaxts", "concretizer"]
    assert main(["validate", str(small_dataset)]) == 0
    assert "valid" in capsys.readouterr().out
    files = table_files(small_dataset, "rows")  # --part-mb sets the part count from the volume
    assert len(files) == num_parts(sum(payload_bytes(pq.read_table(f)) for f in files),
                                   int(float(PART_MB) * 2**20)) == 3
    assert main(["inspect", str(small_dataset), "--rows", "2"]) == 0
    shown = capsys.readouterr().out
    assert "[rows] pruned-synth/rows v1: 450 rows (real 50, synthetic 300, test 100)" in shown
    assert "y_observed" in shown and "Label the classifier sees" in shown
    assert main(["train", "pruned-synth", "--data", str(small_dataset), "--out", str(tmp_path / "t")]) == 0
    metrics = json.loads((tmp_path / "t" / "metrics.json").read_text())
    assert len(metrics["experiments"]) == 1
    assert (tmp_path / "t" / "accuracy.png").stat().st_size > 1000


@pytest.mark.pipeline
def test_installed_entry_point_runs_without_traceback(tmp_path):
    exe = os.path.join(os.path.dirname(sys.executable), "shardsmith")
    if not os.path.exists(exe):
        pytest.skip("the shardsmith console script is not installed in this environment (pip install -e .)")
    bad = subprocess.run([exe, "run", "pruned-synth", "--set", "epsilon=2"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip() == "shardsmith: error: key 'epsilon' must be in [0, 1], got 2.0"
    ok = subprocess.run([exe, "run", "pruned-synth", "--out", str(tmp_path), "--set", "m=100",
                         "--set", "n_test=50"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "rows" in ok.stdout and "synthetic 100" in ok.stdout


def test_train_with_unknown_x_axis_is_one_line(capsys, small_dataset):
    err = _one_line_error(capsys, ["train", "pruned-synth", "--data", str(small_dataset), "--set", "x_axis=colour"])
    assert "x_axis 'colour' is not a parameter; choose one of" in err
