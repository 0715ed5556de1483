"""Shared fixtures: run a dataset in-process and read the result back; the test tiers.

Tiers. A test that drives Chromium, loads or trains a model, runs a pipeline end to end, starts a
cluster or an object-store server, or runs a benchmark carries a marker that says so (declared in
pyproject.toml); `make check` runs the tests that carry none. Tests that use the fixtures below
that start such things are marked by the fixture (FIXTURE_MARKS), so a new test cannot forget.
"""
from __future__ import annotations

import collections
import json
import os
import tempfile

# in a parallel run (pytest-xdist) each worker, and every process it starts, computes on one thread:
# the workers already fill the cores, and OpenMP threads that outnumber them spin instead of working.
# Set before numpy is first imported (pyarrow imports it): OpenBLAS reads it once, at load, and a
# worker that loaded it first ran two BLAS threads whatever the variable said later
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402

# one result store per test session, never the user's ~/.cache/shardsmith (set before pipelines import it)
os.environ["SHARDSMITH_CACHE"] = tempfile.mkdtemp(prefix="shardsmith-test-store-")
# what the processes of a machine share (core/machine.py): the test session's own, with its processes
os.environ.setdefault("SHARDSMITH_MACHINE_DIR", tempfile.mkdtemp(prefix="shardsmith-test-machine-"))

from pipelines import registry, run  # noqa: E402
from transforms.web.chromium import CHROMIUM, DEFAULT_ARGS, INSTALL_HINT  # noqa: E402

# where the renderer's Chromium is missing, the tests that drive it skip with this reason (None: it is there)
NO_CHROMIUM = None if os.path.exists(CHROMIUM) else f"needs Chromium at {CHROMIUM}: {INSTALL_HINT}"
needs_chromium = pytest.mark.skipif(NO_CHROMIUM is not None, reason=NO_CHROMIUM or "")


def skip_without_chromium() -> None:
    """Inside a test or fixture: skip it where the renderer's Chromium is missing."""
    if NO_CHROMIUM:
        pytest.skip(NO_CHROMIUM)


# real sample data (KITTI, Lean, WARC), kept in the repository: tests/data/README.md says what and whence
TEST_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def _store(tmp_path_factory, make):
    from tests import stores
    pytest.importorskip("moto") if make is stores.s3_server else pytest.importorskip("gcp_storage_emulator")
    store = make(str(tmp_path_factory.mktemp("store-logs"))).start()
    mp = pytest.MonkeyPatch()
    for key, value in store.env.items():
        mp.setenv(key, value)
    yield store
    mp.undo()
    store.stop()


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium headless shell through Playwright (what Playwright itself runs headless),
    one per test module, started as the renderer starts it; skips where it is missing."""
    sync_api = pytest.importorskip("playwright.sync_api")
    skip_without_chromium()
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=list(DEFAULT_ARGS))
        yield b
        b.close()


def solid_png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A solid RGB PNG, written by hand (no imaging library): an image whose arrival shows in a
    screenshot."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\0" + bytes(rgb) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def send_body(handler, status: int, ctype: str, body, headers=()) -> None:
    """A test server's whole answer: status, Content-Type, Content-Length, extra headers, body."""
    body = body.encode() if isinstance(body, str) else body
    handler.send_response(status)
    handler.send_header("Content-Type", ctype)
    handler.send_header("Content-Length", str(len(body)))
    for k, v in headers:
        handler.send_header(k, v)
    handler.end_headers()
    handler.wfile.write(body)


def websocket_accept(key: str) -> str:
    """The Sec-WebSocket-Accept that answers a handshake's Sec-WebSocket-Key (RFC 6455)."""
    import base64
    import hashlib
    return base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()


def websocket_payloads(data: bytes) -> list[tuple[bytes, bytes]]:
    """(mask key, unmasked payload) of each whole client frame in `data` (RFC 6455): what a server
    reads from a browser's side of a WebSocket."""
    out, i = [], 0
    while i + 2 <= len(data):
        n, at = data[i + 1] & 0x7F, i + 2
        if n == 126:
            n, at = int.from_bytes(data[at:at + 2], "big"), at + 2
        elif n == 127:
            n, at = int.from_bytes(data[at:at + 8], "big"), at + 8
        key = data[at:at + 4] if data[i + 1] & 0x80 else b"\0\0\0\0"
        at += 4 if data[i + 1] & 0x80 else 0
        if at + n > len(data):
            break
        out.append((key, bytes(b ^ key[j % 4] for j, b in enumerate(data[at:at + n]))))
        i = at + n
    return out


def websocket_frame(message: bytes, deflate: bool = False) -> bytes:
    """One unmasked text frame from a server; with `deflate`, the payload compressed as
    permessage-deflate sends it and RSV1 set."""
    import zlib
    first = 0x81                                   # FIN, text
    if deflate:
        z = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
        message, first = (z.compress(message) + z.flush(zlib.Z_SYNC_FLUSH))[:-4], 0xC1   # RSV1: compressed
    n = len(message)
    length = bytes([n]) if n < 126 else (bytes([126]) + n.to_bytes(2, "big") if n < 65536
                                         else bytes([127]) + n.to_bytes(8, "big"))
    return bytes([first]) + length + message


def loopback_server(handler, host: str = "127.0.0.1"):
    """(server, base URL): a threaded HTTP server for `handler` on `host` (a loopback address) at a
    free port, serving from a daemon thread; the caller shuts it down."""
    from http.server import ThreadingHTTPServer
    import threading
    server = ThreadingHTTPServer((host, 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://{host}:{server.server_address[1]}"


class ScriptedOpenAI:
    """An OpenAI-compatible server on loopback whose answers a test scripts: `answer(path, body)`
    returns the choice for one POST (`{"text": ...}` for /v1/completions, `{"message": {"content":
    ...}}` for /v1/chat/completions); finish_reason "stop" unless the choice says otherwise."""

    def __init__(self, answer):
        from http.server import BaseHTTPRequestHandler

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                choice = dict({"finish_reason": "stop"}, **answer(self.path, body))
                send_body(self, 200, "application/json", json.dumps(
                    {"choices": [choice], "usage": {"prompt_tokens": 9, "completion_tokens": 9}}))

        self.server, base = loopback_server(Handler)
        self.url = base + "/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


GENERATION = "run-20250101T000000Z-0000cafe"  # the sink writes each run's parts in a folder of their own


def write_warc(path, records) -> str:
    """A gzipped WARC at `path` of response records, each (url, status line, headers as a dict or
    (name, value) pairs, body bytes[, WARC-Date]): what a crawler would have archived."""
    import io

    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter
    with open(path, "wb") as fh:
        writer = WARCWriter(fh, gzip=True)
        for url, status, headers, body, *date in records:
            pairs = list(headers.items()) if isinstance(headers, dict) else list(headers)
            http = StatusAndHeaders(status, pairs, protocol="HTTP/1.1")
            writer.write_record(writer.create_warc_record(url, "response", payload=io.BytesIO(body), http_headers=http,
                                                          warc_headers_dict={"WARC-Date": date[0]} if date else None))
    return str(path)


def write_dataset(root, dataset: str, tables: dict, config: dict | None = None) -> None:
    """A published dataset written by hand, laid out as the sink lays it out (one generation folder,
    parts, `_manifest.json`): `tables` maps each TableSchema to its files, each a list of row groups,
    each a list of rows. For trainer tests, whose subject is reading shards, not making them."""
    entries = {}
    for table, files in tables.items():
        os.makedirs(os.path.join(root, GENERATION, table.table), exist_ok=True)
        listed, rows = [], []
        for k, groups in enumerate(files):
            rel = f"{GENERATION}/{table.table}/part-{k:05d}-of-{len(files):05d}.parquet"
            with pq.ParquetWriter(os.path.join(root, rel), table.arrow) as writer:
                for group in groups:
                    writer.write_table(table.to_arrow(group))
            rows += [r for group in groups for r in group]
            listed.append({"path": rel, "rows": sum(map(len, groups)),
                           "bytes": os.path.getsize(os.path.join(root, rel))})
        splits = collections.Counter(r[table.split_field] for r in rows) if table.split_field else {}
        entries[table.table] = {"schema": table.name, "version": table.version, "fingerprint": table.fingerprint,
                                "rows": len(rows), "files": listed, "splits": dict(splits)}
    manifest = {"format": "shardsmith.manifest/1", "dataset": dataset, "tables": entries,
                "dead_letters": {"count": 0, "files": []}, "config": dict(config or {}), "generation": GENERATION}
    with open(os.path.join(root, "_manifest.json"), "w") as fh:
        json.dump(manifest, fh)


@pytest.fixture(scope="session")
def s3_store(tmp_path_factory):
    """moto's S3 server on a loopback port, AWS_ENDPOINT_URL and test credentials set; .bucket() makes one."""
    from tests import stores
    yield from _store(tmp_path_factory, stores.s3_server)


@pytest.fixture(scope="session")
def gcs_store(tmp_path_factory):
    """gcp-storage-emulator on a loopback port, STORAGE_EMULATOR_HOST set; .bucket() makes one."""
    from tests import stores
    yield from _store(tmp_path_factory, stores.gcs_server)


@pytest.fixture
def run_dataset(tmp_path):
    """run_dataset(name, *sets, runner=..., **kw) -> (dataset folder, manifest)."""
    def _run(name, *sets, out=None, **kwargs):
        out = str(out or tmp_path / "out")
        manifest = run.run(registry.get(name), out=out, sets=list(sets), **kwargs)
        return os.path.join(out, name), manifest
    return _run


def read_manifest(path):
    with open(os.path.join(path, "_manifest.json")) as fh:
        return json.load(fh)


def table_entry(manifest: dict, table: str) -> dict:
    """A table's manifest entry; "_dead_letter" names the dead letters."""
    return manifest["dead_letters"] if table == "_dead_letter" else manifest["tables"][table]


def table_files(path, table: str, manifest: dict | None = None) -> list[str]:
    """Local paths of `table`'s part files, in the order the manifest at `path` lists them."""
    manifest = manifest or read_manifest(path)
    return [os.path.join(str(path), f["path"]) for f in table_entry(manifest, table)["files"]]


def read_table(path, table: str, columns=None, manifest: dict | None = None):
    """`table` of the dataset (or failed generation) at `path`: the files its manifest lists, concatenated."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    files = table_files(path, table, manifest)
    return pa.concat_tables([pq.read_table(f, columns=columns) for f in files]) if files else pa.table({})


def read_rows(path, table: str, manifest: dict | None = None) -> list[dict]:
    return read_table(path, table, manifest=manifest).to_pylist()


def without_generation(entry):
    """A copy of a manifest entry (its tables, its dead letters) with every file path relative to the
    generation folder: two runs of the same data differ only in that folder's name."""
    from transforms.io import layout
    if isinstance(entry, dict):
        return {k: v.split("/", 1)[1] if k == "path" and layout.generation_of(v) else without_generation(v)
                for k, v in entry.items()}
    if isinstance(entry, list):
        return [without_generation(v) for v in entry]
    return entry


def parquet_digests(path, other_runs: bool = False) -> dict[str, str]:
    """{path inside the generation folder: sha256} of every Parquet file the manifest lists; asserts
    that no other Parquet file lies in the dataset folder (generations differ between runs, the
    files inside them must not). other_runs: allow files in other `run-*` folders (a killed run's
    generation, which no manifest lists)."""
    import glob
    import hashlib
    from transforms.io import layout
    path = str(path)
    manifest = read_manifest(path)
    generation = manifest.get("generation")
    listed = [f["path"] for t in list(manifest["tables"]) + ["_dead_letter"]
              for f in table_entry(manifest, t)["files"]]
    on_disk = sorted(rel for rel in (os.path.relpath(f, path) for f in glob.glob(
        os.path.join(path, "**", "*.parquet"), recursive=True))
        if not (other_runs and layout.generation_of(rel) not in (None, generation)))
    assert on_disk == sorted(listed), "Parquet files the manifest does not list, or missing ones"
    assert generation and all(layout.generation_of(p) == generation for p in listed)
    return {p.split("/", 1)[1]: hashlib.sha256(open(os.path.join(path, p), "rb").read()).hexdigest()
            for p in listed}


def written_files(folder, suffix: str = "") -> dict[str, tuple[int, int]]:
    """Every file under `folder` ending in `suffix` -> (inode, mtime): an entry computed again is
    written again, so equal dicts before and after a run mean the run stored nothing new."""
    out = {}
    for root, _, files in os.walk(str(folder)):
        for name in files:
            if name.endswith(suffix):
                st = os.stat(os.path.join(root, name))
                out[os.path.relpath(os.path.join(root, name), str(folder))] = (st.st_ino, st.st_mtime_ns)
    return out


@pytest.fixture(scope="session")
def converted_model_cache(tmp_path_factory):
    """One model cache for the whole session, shared by the xdist workers (the conversion takes a
    lock, so one worker converts and the others wait): the bundled SmolLM2 is converted once (about
    17 s), offline, and generation uses one torch thread (the machine's 2 cores are shared)."""
    torch = pytest.importorskip("torch")
    from transforms.llm import models
    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "models"   # the run's own folder
    cache.mkdir(exist_ok=True)
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv(models.CACHE_ENV, str(cache))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield os.environ[models.CACHE_ENV]
    torch.set_num_threads(threads)
    mp.undo()


@pytest.fixture(scope="session")
def small_local(tmp_path_factory):
    """small_local(dataset) -> (folder, manifest) of tests/small_runs.py's local run of `dataset`,
    one per test run, shared by the xdist workers (tests/small_runs.py: local_reference)."""
    from tests.small_runs import local_reference
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base   # the run's own folder
    return lambda dataset: local_reference(dataset, str(shared))


@pytest.fixture(scope="session", autouse=True)
def _session_store():
    """Remove the session's result store at the end (a worker-process test may still have written to it)."""
    yield
    import shutil
    shutil.rmtree(os.environ["SHARDSMITH_CACHE"], ignore_errors=True)


def pytest_runtest_logreport(report):
    """With SHARDSMITH_TEST_TIMES=FILE, each test phase's seconds are appended there as it ends (a
    killed or timed-out run still says where its time went)."""
    path = os.environ.get("SHARDSMITH_TEST_TIMES")
    if path and not os.environ.get("PYTEST_XDIST_WORKER"):   # under xdist the controller writes each once
        with open(path, "a") as fh:
            fh.write(f"{report.duration:.2f}\t{report.when}\t{report.outcome}\t{report.nodeid}\n")


def _tree_cpu_s() -> float:
    """CPU seconds of this process and every process below it, the exited ones included (their time
    is in their parent's children_* figures once reaped)."""
    import psutil
    total = 0.0
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With SHARDSMITH_TEST_CPU=FILE, each test's CPU seconds (its setup, call and teardown, in its
    own process tree: browsers, clusters and subprocesses included) and wall seconds are appended
    there. On a machine where every core is busy, CPU seconds are what the suite's time is made of."""
    path = os.environ.get("SHARDSMITH_TEST_CPU")
    if not path:
        yield
        return
    import time
    cpu, wall, busy = _tree_cpu_s(), time.perf_counter(), _machine_busy_s()
    yield
    with open(path, "a") as fh:
        fh.write(f"{_tree_cpu_s() - cpu:.2f}\t{time.perf_counter() - wall:.2f}\t{_machine_busy_s() - busy:.2f}"
                 f"\t{item.nodeid}\t{time.time():.2f}\t{os.environ.get('PYTEST_XDIST_WORKER', '-')}\n")


def _machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine so far (/proc/stat; 0 elsewhere): with one test process
    (-n 0), a test's share includes what its process tree cannot see, e.g. a browser that outlived
    its wrapper and was reparented."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(v) for v in fh.readline().split()[1:]]
    except OSError:
        return 0.0
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")   # less idle and iowait


# a test that uses one of these fixtures is heavy for the fixture's reason
FIXTURE_MARKS = {"browser": "browser", "converted_model_cache": "model", "run_dataset": "pipeline", "small_local": "pipeline", "s3_store": "store",
                 "gcs_store": "store"}
HEAVY_GUESS_S = 10.0   # seconds a heavy test is guessed to take until tests/durations.json has its file


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true",
                     help="the fast tier: leave out every test with a heavy marker (those pyproject.toml declares)")


def heavy_marks(config) -> tuple[str, ...]:
    """Every marker pyproject.toml declares says why a test is heavy: the one list of them."""
    return tuple(line.split(":")[0].strip() for line in config.getini("markers"))


def pytest_collection_modifyitems(config, items):
    """Mark each test for the heavy fixtures it uses (FIXTURE_MARKS here, and a test module's own
    FIXTURE_MARKS for its module fixtures, e.g. {"trained": "model"}); with --fast, leave out every
    marked test; then put the longest files first. Parallel workers (pytest-xdist, one file per
    worker at a time) then start the long files at once and fill in with short ones, instead of
    meeting a long file at the end."""
    heavy = heavy_marks(config)
    for item in items:
        marks = {**FIXTURE_MARKS, **getattr(getattr(item, "module", None), "FIXTURE_MARKS", {})}
        for fixture in set(getattr(item, "fixturenames", ())) & set(marks):
            for mark in marks[fixture].split(","):
                item.add_marker(mark)
    if config.getoption("fast"):
        left_out = [item for item in items if any(item.get_closest_marker(m) for m in heavy)]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if not any(item.get_closest_marker(m) for m in heavy)]
    cost = _file_costs(items, heavy)
    items.sort(key=lambda item: -cost[item.nodeid.split("::")[0]])   # stable: a file's order is kept


def _file_costs(items, heavy: tuple[str, ...]) -> dict[str, float]:
    """Seconds per test file: as measured on a full run (tests/durations.json, refreshed by hand
    from SHARDSMITH_TEST_CPU's wall-seconds column, summed per file: how long the file holds a
    worker, waiting included; a stale figure only changes the order), else guessed from the marks."""
    path = os.path.join(os.path.dirname(__file__), "durations.json")
    with open(path) as fh:
        measured = json.load(fh)
    cost: dict[str, float] = {}
    for item in items:
        name = item.nodeid.split("::")[0]
        marked = any(item.get_closest_marker(mark) for mark in heavy)
        cost[name] = cost.get(name, 0.0) + (HEAVY_GUESS_S if marked else 0.1)
    return {name: measured.get(os.path.basename(name), guess) for name, guess in cost.items()}


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """In the fast tier, name the tests that took long without a heavy marker (a hint, never a failure:
    no test asserts on time)."""
    if not config.getoption("fast"):
        return
    slow = sorted(((r.duration, r.nodeid) for key in ("passed", "failed")
                   for r in terminalreporter.stats.get(key, []) if r.when == "call" and r.duration > 5.0),
                  reverse=True)
    if slow:
        terminalreporter.write_line(f"fast tier: {len(slow)} unmarked tests took over 5 s; mark them "
                                    f"({', '.join(heavy_marks(config))}):")
        for duration, nodeid in slow:
            terminalreporter.write_line(f"  {duration:6.1f} s  {nodeid}")

