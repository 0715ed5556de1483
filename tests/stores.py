"""Real object-store protocol servers on loopback, started by the tests: moto's S3 server and
gcp-storage-emulator's GCS JSON API. The product finds them only through the standard variables
(AWS_ENDPOINT_URL and the AWS credentials; STORAGE_EMULATOR_HOST), as every AWS and Google client does."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid

import pyarrow.fs as pafs

from core.ports import on_free_port

BIN = os.path.dirname(sys.executable)


class ServerExited(RuntimeError):
    """The server process ended before it listened (on a picked port: most often, someone took it)."""


def listening_ports(pid: int) -> set[int]:
    """TCP ports on which process `pid` itself holds a listening socket (from /proc)."""
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return set()
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as fh:
                lines = fh.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:   # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """Wait until `proc` itself listens on `port`: a connection could reach another process that
    took the port, so the socket's owner is read from /proc rather than trusted to answer."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise ServerExited(f"server {proc.args[0]} exited with {proc.returncode} before listening on {port}")
        if port in listening_ports(proc.pid):
            return
        time.sleep(0.1)
    raise RuntimeError(f"server {proc.args[0]} did not listen on 127.0.0.1:{port} within {timeout:.0f} s")


def start_on_free_port(launch, port: int | None = None):
    """`launch(port)` starts a server and waits for it (wait_for_port); a picked port that another
    process took first is picked again, a port named is kept (a restart)."""
    return on_free_port(launch, port, ServerExited)


class Store:
    """One server process; `env` is what a client (this process, a CLI, a Dask worker) needs.
    `command(port)` and `environment(port)` give the server's command line and that env."""

    def __init__(self, scheme: str, command, environment, log_dir: str):
        self.scheme, self.command, self.environment = scheme, command, environment
        self.log_dir = log_dir
        self.port: int | None = None   # picked at the first start, kept by a restart
        self.env: dict[str, str] = {}
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Store":
        start_on_free_port(self._launch, self.port)
        return self

    def _launch(self, port: int) -> None:
        with open(os.path.join(self.log_dir, f"{self.scheme}-{port}.log"), "ab") as log:
            self.proc = subprocess.Popen(self.command(port), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        wait_for_port(port, self.proc)
        self.port, self.env = port, self.environment(port)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def filesystem(self, s3_attempts: int = 3) -> pafs.FileSystem:
        """A pyarrow client of this server; S3 requests are tried `s3_attempts` times (pyarrow's default 3)."""
        if self.scheme == "s3":
            return pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{self.port}", scheme="http",
                                     access_key="testing", secret_key="testing", region="us-east-1",
                                     allow_bucket_creation=True, allow_bucket_deletion=True,
                                     retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=s3_attempts))
        return pafs.GcsFileSystem(anonymous=True, scheme="http", endpoint_override=f"127.0.0.1:{self.port}",
                                  project_id="test-project")

    def bucket(self, name: str | None = None) -> str:
        """Create a fresh bucket (the product never creates buckets) and return its URL."""
        name = name or f"t-{uuid.uuid4().hex[:10]}"
        self.filesystem().create_dir(name)
        return f"{self.scheme}://{name}"


def s3_server(log_dir: str) -> Store:
    moto = shutil.which("moto_server", path=BIN) or "moto_server"
    return Store("s3", lambda port: [moto, "-H", "127.0.0.1", "-p", str(port)],
                 lambda port: {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
                               "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
                               "AWS_EC2_METADATA_DISABLED": "true"}, log_dir)


def gcs_server(log_dir: str) -> Store:
    emulator = shutil.which("gcp-storage-emulator", path=BIN) or "gcp-storage-emulator"
    return Store("gs", lambda port: [emulator, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"],
                 lambda port: {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"}, log_dir)
