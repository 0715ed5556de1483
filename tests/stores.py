"""Real object-store protocol servers on loopback, started by the tests: moto's S3 server and
gcp-storage-emulator's GCS JSON API. The product finds them only through the standard variables
(AWS_ENDPOINT_URL and the AWS credentials; STORAGE_EMULATOR_HOST), as every AWS and Google client does."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid

import pyarrow.fs as pafs

BIN = os.path.dirname(sys.executable)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"store server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"store server did not listen on 127.0.0.1:{port} within {timeout:.0f} s")


class Store:
    """One server process; `env` is what a client (this process, a CLI, a Dask worker) needs."""

    def __init__(self, scheme: str, command: list[str], env: dict[str, str], port: int, log_dir: str):
        self.scheme, self.command, self.env, self.port = scheme, command, env, port
        self.log_dir = log_dir
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Store":
        log = open(os.path.join(self.log_dir, f"{self.scheme}-{self.port}.log"), "ab")
        self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        wait_for_port(self.port, self.proc)
        return self

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
    port = free_port()
    moto = shutil.which("moto_server", path=BIN) or "moto_server"
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true"}
    return Store("s3", [moto, "-H", "127.0.0.1", "-p", str(port)], env, port, log_dir)


def gcs_server(log_dir: str) -> Store:
    port = free_port()
    emulator = shutil.which("gcp-storage-emulator", path=BIN) or "gcp-storage-emulator"
    env = {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"}
    return Store("gs", [emulator, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"],
                 env, port, log_dir)
