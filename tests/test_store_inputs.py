"""Inputs in object stores: every dataset's readers take an s3:// or gs:// URL as they take a path,
against real S3 and GCS protocol servers on loopback, and give the same rows as from local files."""
from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines import registry, run
from core.config import ConfigError, matching_files
from pipelines.dataset import input_fingerprint
from core import storage
from core.rejected import Rejected
from tests.conftest import skip_without_chromium

pytestmark = [pytest.mark.store, pytest.mark.pipeline]

HERE = os.path.dirname(os.path.abspath(__file__))
KITTI = os.path.join(HERE, "..", "pipelines", "samples", "kitti", "training")
WEB_DATA = os.path.join(HERE, "data", "web")
CLI = [sys.executable, "-m", "pipelines.cli"]


def _upload(local: str, url: str) -> str:
    with open(local, "rb") as fh:
        storage.write_bytes(url, fh.read())
    return url


def _parts(out: str, manifest: dict, table: str) -> list[tuple[str, bytes]]:
    """(path below the generation, bytes) of each part of a table, in the manifest's order."""
    return [(f["path"].split("/", 1)[1], storage.read_bytes(storage.join(out, f["path"])))
            for f in manifest["tables"][table]["files"]]


def _rows(out: str, manifest: dict, table: str) -> list[dict]:
    return [row for _, data in _parts(out, manifest, table) for row in pq.read_table(pa.py_buffer(data)).to_pylist()]


def _sha(fingerprint: str) -> str:
    return fingerprint.rsplit(" ", 1)[1]


def test_concretizer_from_scans_and_weights_in_s3_equals_a_local_run(s3_store, tmp_path):
    pytest.importorskip("spconv")
    torch = pytest.importorskip("torch")
    from core.voxel_backbone import VoxelBackBone8x
    bucket = s3_store.bucket()
    for folder, name in (("velodyne", "000000.bin"), ("calib", "000000.txt"), ("label_2", "000000.txt")):
        _upload(os.path.join(KITTI, folder, name), f"{bucket}/kitti/training/{folder}/{name}")
    model = VoxelBackBone8x.from_seed(3, 4, (41, 1600, 1408))
    weights = tmp_path / "checkpoint.pth"
    torch.save({"model_state": {"backbone_3d." + k: v for k, v in model.state_dict().items()}}, weights)
    _upload(str(weights), f"{bucket}/weights/checkpoint.pth")
    small = ["simulated=0", "layers=conv2"]
    local = run.run(registry.get("concretizer"), out=str(tmp_path / "local"), quiet=True, sets=small + [
        f"scans={os.path.abspath(KITTI)}/velodyne/*.bin", f"weights={weights}"])
    remote = run.run(registry.get("concretizer"), out=str(tmp_path / "remote"), quiet=True, sets=small + [
        f"scans={bucket}/kitti/training/velodyne/*.bin", f"weights={bucket}/weights/checkpoint.pth"])
    local_dir, remote_dir = str(tmp_path / "local" / "concretizer"), str(tmp_path / "remote" / "concretizer")
    frames = _rows(remote_dir, remote, "frames")
    assert [f["source_ref"] for f in frames] == ["training/velodyne/000000.bin"]
    assert [lab["type"] for lab in frames[0]["labels"]] == ["Pedestrian"]          # label_2 read from the store
    assert 10_000 < frames[0]["num_points"] < frames[0]["num_points_raw"]         # calib read: the FOV filter ran
    for table in ("frames", "voxels", "features", "occupancy"):
        assert [r["id"] for r in _rows(remote_dir, remote, table)] == [r["id"] for r in _rows(local_dir, local, table)]
        assert _parts(remote_dir, remote, table) == _parts(local_dir, local, table), table  # byte-identical
    checkpoint = "sha256:" + hashlib.sha256(weights.read_bytes()).hexdigest()
    assert {r["backbone"] for r in _rows(remote_dir, remote, "features")} == {checkpoint}  # the weights from the store
    assert _sha(remote["inputs"]["scan/000000.bin"]) == _sha(local["inputs"]["scan/000000.bin"])
    assert remote["inputs"]["scan/000000.bin"].startswith(f"{bucket}/kitti/training/velodyne/000000.bin sha256:")
    assert _sha(remote["inputs"]["weights"]) == _sha(local["inputs"]["weights"])


def test_pruned_synth_features_from_s3_equal_the_local_file(s3_store, tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 6)).astype(np.float64)
    y = np.where(rng.random(200) < 0.5, -1, 1)
    path = tmp_path / "features.parquet"
    pq.write_table(pa.table({"x": [list(r) for r in x], "y": y.tolist()}), path)
    url = _upload(str(path), s3_store.bucket() + "/in/features.parquet")
    sets = ["n=80", "n_hat=40", "m=300", "n_test=100"]
    local = run.run(registry.get("pruned-synth"), out=str(tmp_path / "local"), quiet=True, sets=sets + [f"features={path}"])
    remote = run.run(registry.get("pruned-synth"), out=str(tmp_path / "remote"), quiet=True, sets=sets + [f"features={url}"])
    assert remote["tables"]["rows"]["rows"] == local["tables"]["rows"]["rows"] > 0
    real = {r["index"]: r for r in _rows(str(tmp_path / "remote" / "pruned-synth"), remote, "rows")
            if r["source"] == "real"}
    assert len(real) == 80 and np.allclose(real[5]["x"], x[5].astype(np.float32))  # the file's rows, from the store
    assert _parts(str(tmp_path / "remote" / "pruned-synth"), remote, "rows") == \
        _parts(str(tmp_path / "local" / "pruned-synth"), local, "rows")      # same ids, byte-identical parts
    assert remote["inputs"]["features"] == f"{url} {_sha(local['inputs']['features'])}"


def test_readers_read_from_gcs(gcs_store, tmp_path):
    """The other readers, each from gs:// (the rmaxts ones need no Lean to read)."""
    from transforms.lean.problems import read_jsonl, read_lean_file, read_leandojo
    from transforms.synth.features import features_shape, read_features
    from transforms.text.seeds import read_seeds
    from transforms.web.targets import read_url_list, scan_warc
    from transforms.web.warc_archive import WarcArchive
    bucket = gcs_store.bucket()
    problems = os.path.join(HERE, "..", "pipelines", "samples", "lean", "minif2f_sample.jsonl")
    url = _upload(problems, f"{bucket}/lean/minif2f_sample.jsonl")
    assert list(read_jsonl(url)) == list(read_jsonl(problems)) and len(list(read_jsonl(url))) == 8
    storage.write_bytes(f"{bucket}/lean/Valid.lean", b"import Mathlib\n\n/-- one plus one -/\n"
                        b"theorem two : 1 + 1 = 2 := by\n  sorry\n\ntheorem done : True := trivial\n")
    good, bad = list(read_lean_file(f"{bucket}/lean/Valid.lean"))
    assert good.name == "two" and good.split == "valid" and good.formal_statement == "theorem two : 1 + 1 = 2 := by"
    assert isinstance(bad, Rejected) and bad.reason.startswith(f"{bucket}/lean/Valid.lean:")
    storage.write_bytes(f"{bucket}/lean/trace.jsonl", b'{"full_name": "t", "traced_tactics": [{"tactic": "simp", '
                        b'"state_before": "x", "state_after": "no goals"}]}\n')
    (step,) = read_leandojo(f"{bucket}/lean/trace.jsonl")
    assert (step["tactic"], step["state_after"]) == ("simp", "")
    assert matching_files(f"{bucket}/lean/*.jsonl", "problems") == [f"{bucket}/lean/minif2f_sample.jsonl",
                                                                     f"{bucket}/lean/trace.jsonl"]

    storage.write_bytes(f"{bucket}/seeds/math.jsonl", b'{"instruction": "Add 2 and 3.", "output": "5"}\n'
                        b'not json\n\xff\n')
    seeds = list(read_seeds(f"{bucket}/seeds/math.jsonl", "math"))
    assert seeds[0]["instruction"] == "Add 2 and 3." and [type(s) for s in seeds[1:]] == [Rejected, Rejected]
    from pipelines.selfmoe import seed_files
    assert seed_files({"domains": "math", "seeds_dir": f"{bucket}/seeds"}) == [("math", f"{bucket}/seeds/math.jsonl")]
    with pytest.raises(ConfigError, match="no seed file for domain 'coding'"):
        seed_files({"domains": "coding", "seeds_dir": f"{bucket}/seeds"})

    # a Waymo frame as OpenPCDet's preprocessing saves it, read from the store as from a folder
    from transforms.lidar.readers import WaymoPoints, read_points
    frame = np.random.default_rng(3).normal(size=(50, 6)).astype(np.float32)
    frame[:, 5] = np.where(np.arange(50) % 5 == 0, 1.0, -1.0)   # every fifth point in a no-label zone
    local_npy = tmp_path / "0000.npy"
    np.save(local_npy, frame)
    npy = _upload(str(local_npy), f"{bucket}/waymo/segment-1/0000.npy")
    for waymo in (WaymoPoints(), WaymoPoints(no_label_zone="drop")):
        got = read_points(npy, "waymo", waymo)
        assert np.array_equal(got, read_points(str(local_npy), "waymo", waymo))
    assert len(got) == 40 and np.array_equal(got[:, 3], np.tanh(frame[frame[:, 5] == -1, 3]))

    buf = io.BytesIO()
    np.savez(buf, x=np.arange(12, dtype=np.float64).reshape(4, 3), y=np.array([1, -1, 1, 7]))
    storage.write_bytes(f"{bucket}/f.npz", buf.getvalue())
    assert features_shape(f"{bucket}/f.npz").rows == 4
    items = list(read_features(f"{bucket}/f.npz"))
    assert [type(i) for i in items] == [tuple, tuple, tuple, Rejected]

    storage.write_bytes(f"{bucket}/urls.txt", b"# pages\nhttps://example.org/a\nnot a url\n")
    targets = list(read_url_list(f"{bucket}/urls.txt"))
    assert targets[0].url == "https://example.org/a" and targets[1].reason.startswith(f"{bucket}/urls.txt:3:")

    warc = _upload(os.path.join(WEB_DATA, "whirlwind.warc.gz"), f"{bucket}/warc/whirlwind.warc.gz")
    (target,) = [t for t in scan_warc(warc) if not isinstance(t, Rejected)]
    assert target.source_ref == f"{warc}#1023"       # the same record offset as from the local file
    archive, local = WarcArchive(warc), WarcArchive(os.path.join(WEB_DATA, "whirlwind.warc.gz"))
    assert archive.urls() == local.urls() and archive.lookup(target.url) == local.lookup(target.url)


def test_fingerprints_of_a_prefix_and_a_folder_agree(s3_store, tmp_path):
    bucket = s3_store.bucket()
    for rel, data in (("b/c.html", b"<p>c</p>"), ("a.html", b"<p>a</p>"), ("c.html", b"")):
        os.makedirs(os.path.dirname(tmp_path / "site" / rel), exist_ok=True)
        (tmp_path / "site" / rel).write_bytes(data)
        storage.write_bytes(f"{bucket}/site/{rel}", data)
    local, remote = input_fingerprint(str(tmp_path / "site")), input_fingerprint(f"{bucket}/site")
    assert remote.startswith(f"{bucket}/site sha256:") and _sha(remote) == _sha(local)
    assert _sha(input_fingerprint(f"{bucket}/site/a.html")) == _sha(input_fingerprint(str(tmp_path / "site/a.html")))
    storage.write_bytes(f"{bucket}/site/b/c.html", b"<p>changed</p>")
    assert _sha(input_fingerprint(f"{bucket}/site")) != _sha(local)


def test_multiui_from_an_html_folder_in_s3_equals_the_local_folder(s3_store, tmp_path):
    """The pages are served to Chromium from the store by each worker's loopback server."""
    skip_without_chromium()
    pytest.importorskip("playwright")
    site, bucket = os.path.join(HERE, "..", "pipelines", "sites", "multiui"), s3_store.bucket()
    for rel in ("index.html", "shop.html", "style.css", "img/tent.png", "img/stove.png", ".hidden.html"):
        os.makedirs(os.path.dirname(tmp_path / "site" / rel), exist_ok=True)
        data = open(os.path.join(site, rel), "rb").read() if os.path.exists(os.path.join(site, rel)) else b"<p>x</p>"
        (tmp_path / "site" / rel).write_bytes(data)
        storage.write_bytes(f"{bucket}/site/{rel}", data)
    # curation's language and blocklist checks left out: they load large data, and decide nothing here
    sets = ["platforms=desktop", "llm_tasks=false", "max_per_task=2", "follow_links=1", "languages=any",
            "blocklist=none"]
    local = run.run(registry.get("multiui"), out=str(tmp_path / "local"), quiet=True,
                    sets=sets + [f"html_dir={tmp_path / 'site'}"])
    remote = run.run(registry.get("multiui"), out=str(tmp_path / "remote"), quiet=True,
                     sets=sets + [f"html_dir={bucket}/site"])
    local_dir, remote_dir = str(tmp_path / "local" / "multiui"), str(tmp_path / "remote" / "multiui")
    pages = _rows(remote_dir, remote, "pages")
    assert sorted(p["source_ref"] for p in pages) == ["index.html", "shop.html"]
    assert all(p["kept"] and p["screenshot"] for p in pages) and remote["stages"]["render"]["dead"] == 0
    for table in ("pages", "samples"):
        assert _parts(remote_dir, remote, table) == _parts(local_dir, local, table), table   # byte-identical
    assert _sha(remote["inputs"]["local/site"]) == _sha(local["inputs"]["local/site"])


def test_an_html_prefix_is_served_as_a_folder_is(gcs_store):
    import urllib.error
    import urllib.request
    from transforms.web.local_site import LocalSite
    from transforms.web.targets import scan_html_folder
    bucket = gcs_store.bucket()
    for rel, data in (("index.html", b"<h1>home</h1>"), ("a b/page.htm", b"<p>p</p>"), ("style.css", b"p{}"),
                      (".git/x.html", b"no"), ("secret.txt", b"s")):
        storage.write_bytes(f"{bucket}/site/{rel}", data)
    storage.write_bytes(f"{bucket}/outside.html", b"outside")
    assert [t.source_ref for t in scan_html_folder(f"{bucket}/site")] == ["a b/page.htm", "index.html"]

    def get(site, path, method="GET"):
        try:
            with urllib.request.urlopen(urllib.request.Request(site.base_url + path, method=method)) as r:
                return r.status, r.headers.get("Content-Type"), r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, None, b""

    with LocalSite(f"{bucket}/site") as site:
        assert get(site, "") == (200, "text/html", b"<h1>home</h1>")
        assert get(site, "a%20b/page.htm") == (200, "text/html", b"<p>p</p>")
        assert get(site, "style.css")[:2] == (200, "text/css")
        assert get(site, "index.html", "HEAD") == (200, "text/html", b"")
        assert get(site, "missing.html")[0] == 404
        assert get(site, "..%2foutside.html")[0] == 404 and get(site, "a%20b/../../outside.html")[0] == 404
        assert get(site, "index.html", "POST")[0] == 501
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        LocalSite(f"{bucket}/nothing-here")


@pytest.mark.parametrize("case", ["glob matches nothing", "missing bucket", "missing file", "unreachable endpoint",
                                  "empty html prefix"])
def test_unusable_store_inputs_are_one_line_and_exit_2(case, s3_store, tmp_path):
    env = dict(os.environ, SHARDSMITH_STORE_CONNECT_TIMEOUT="2", SHARDSMITH_STORE_REQUEST_TIMEOUT="5",
               SHARDSMITH_STORE_ATTEMPTS="2")
    bucket = s3_store.bucket()
    dataset, expect = "concretizer", "no file matches"
    if case == "glob matches nothing":
        sets = [f"scans={bucket}/kitti/velodyne/*.bin"]
    elif case == "missing bucket":
        sets, expect = ["scans=s3://no-such-bucket-here/velodyne/*.bin"], "bucket 'no-such-bucket-here' does not exist"
    elif case == "missing file":
        dataset, sets, expect = "pruned-synth", [f"features={bucket}/none.parquet"], "not found"
    elif case == "unreachable endpoint":
        from core.ports import free_port
        env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{free_port()}"
        dataset, sets, expect = "pruned-synth", [f"features={bucket}/f.parquet"], "cannot reach the store"
    else:
        dataset, sets, expect = "multiui", [f"html_dir={bucket}/site"], "is not a folder"
    done = subprocess.run(CLI + ["run", dataset, "--out", str(tmp_path / "out"), "--quiet"]
                          + [a for s in sets for a in ("--set", s)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0], lines
    assert not os.path.exists(tmp_path / "out" / dataset)


def test_a_response_cache_in_a_missing_bucket_is_a_config_error(s3_store):
    from pipelines.dataset import check_cache
    check_cache({"cache": s3_store.bucket() + "/responses"})
    with pytest.raises(ConfigError, match="key 'cache': .*bucket 'no-such-cache-bucket' does not exist"):
        check_cache({"cache": "s3://no-such-cache-bucket/responses"})
