"""One filesystem layer for every path shardsmith reads or writes: local, `s3://` or `gs://`.

A cluster's workers share no disk, so inputs, spill files, shards, dead letters,
the manifest, the response cache and the trainers' reads all go through these
functions with a location string: a local path, `file://PATH`, `s3://BUCKET/KEY`
or `gs://BUCKET/KEY`. They are built on pyarrow.fs (see infra/README.md for why):
it is already a core dependency, its S3 and GCS clients stream multipart uploads
and ranged reads in C++, and Parquet and Arrow IPC read and write through it
without a Python copy. It lives beside the schemas because pipelines and
trainers both need it and trainers may import nothing else.

Endpoints and credentials come from the standard variables every AWS and Google
client reads: `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT_URL_S3`), the AWS credential
chain, `AWS_REGION`; `STORAGE_EMULATOR_HOST` for a GCS emulator, else Google's
default credentials.
"""
from __future__ import annotations

import contextlib
import datetime
import fnmatch
import glob as _glob
import json
import os
import re
import uuid
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.fs as pafs

REMOTE_SCHEMES = ("s3", "gs")
STREAM_BUFFER = 1 << 20  # bytes open_stream reads per store request
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


class StorageError(OSError):
    """A location that cannot be used: unknown scheme, missing bucket, no access, no endpoint.
    The CLI prints it as one line and exits 2."""


def scheme(location: str) -> str:
    """'s3', 'gs', or '' for a local path (also for file://)."""
    m = _SCHEME.match(os.fspath(location))
    if not m:
        return ""
    name = m.group(1).lower()
    if name == "file":
        return ""
    if name == "gcs":
        return "gs"
    if name not in REMOTE_SCHEMES:
        raise StorageError(f"{location}: unknown scheme {name}://; use a local path, s3://BUCKET/PREFIX "
                           f"or gs://BUCKET/PREFIX")
    return name


def is_remote(location: str) -> bool:
    return scheme(location) != ""


def normalize(location: str) -> str:
    """The canonical spelling: an absolute local path, or SCHEME://BUCKET/KEY without a trailing /."""
    location = os.fspath(location)
    kind = scheme(location)
    if not kind:
        if location.startswith("file://"):
            location = location[len("file://"):]
        return os.path.abspath(os.path.expanduser(location))
    rest = _SCHEME.sub("", location).strip("/")
    if not rest:
        raise StorageError(f"{location}: no bucket; use {kind}://BUCKET/PREFIX")
    return f"{kind}://{rest}"


def join(base: str, *parts: str) -> str:
    """`base` and relative `parts` ('a/b' allowed), in the spelling of `base`."""
    base = normalize(base)
    parts = [p.strip("/") for p in parts if p and p.strip("/")]
    if not is_remote(base):
        return os.path.join(base, *parts)
    return "/".join([base] + parts)


def relative(location: str, base: str) -> str:
    """`location` relative to `base`, with '/' separators."""
    location, base = normalize(location), normalize(base)
    if not is_remote(base):
        return os.path.relpath(location, base).replace(os.sep, "/")
    if not location.startswith(base + "/"):
        raise ValueError(f"{location} is not under {base}")
    return location[len(base) + 1:]


def parent(location: str) -> str:
    location = normalize(location)
    if not is_remote(location):
        return os.path.dirname(location)
    head, _, _ = location.rpartition("/")
    return head if "://" in head and _SCHEME.sub("", head) else location


def basename(location: str) -> str:
    return normalize(location).rstrip("/").rsplit("/", 1)[-1]


def _seconds(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def filesystem(location: str, *, attempts: int | None = None) -> tuple[pafs.FileSystem, str]:
    """(pyarrow FileSystem, path inside it) for a location. Cheap: no request is made here.
    `attempts`: tries per request (default $SHARDSMITH_STORE_ATTEMPTS, else 5)."""
    location = normalize(location)
    if attempts is None:
        attempts = max(1, int(_seconds("SHARDSMITH_STORE_ATTEMPTS", 5)))
    kind = scheme(location)
    if kind == "":
        return pafs.LocalFileSystem(), location
    path = _SCHEME.sub("", location)
    if kind == "s3":
        # credentials come from the AWS chain (variables, profile files, instance roles) inside pyarrow
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        m = re.match(r"^(?:(https?)://)?([^/]+)/?$", endpoint) if endpoint else None
        if endpoint and not m:
            raise StorageError(f"AWS_ENDPOINT_URL={endpoint!r} is not http(s)://HOST[:PORT]")
        return pafs.S3FileSystem(region=region or "us-east-1",
                                 endpoint_override=m.group(2) if m else None,
                                 scheme=(m.group(1) or "https") if m else None,
                                 connect_timeout=_seconds("SHARDSMITH_STORE_CONNECT_TIMEOUT", 10),
                                 request_timeout=_seconds("SHARDSMITH_STORE_REQUEST_TIMEOUT", 60),
                                 retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=attempts)), path
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    limit = datetime.timedelta(seconds=_seconds("SHARDSMITH_STORE_RETRY_S", 20 * attempts))
    if emulator:  # as Google's own clients do: no credentials, the emulator's address
        m = re.match(r"^(?:(https?)://)?([^/]+)/?$", emulator)
        if not m:
            raise StorageError(f"STORAGE_EMULATOR_HOST={emulator!r} is not HOST:PORT or http://HOST:PORT")
        return pafs.GcsFileSystem(anonymous=True, scheme=m.group(1) or "http", endpoint_override=m.group(2),
                                  retry_time_limit=limit), path
    return pafs.GcsFileSystem(retry_time_limit=limit), path


def _info(location: str) -> pafs.FileInfo:
    fs, path = filesystem(location)
    return fs.get_file_info(path)


def exists(location: str) -> bool:
    return _info(location).type != pafs.FileType.NotFound


def is_file(location: str) -> bool:
    return _info(location).type == pafs.FileType.File


def is_dir(location: str) -> bool:
    """A folder, or on an object store a prefix with at least one object under it."""
    fs, path = filesystem(location)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        return True
    if info.type == pafs.FileType.File or not is_remote(location):
        return False
    return bool(fs.get_file_info(pafs.FileSelector(path, recursive=False, allow_not_found=True)))


def size(location: str) -> int:
    return _info(location).size


def version(location: str) -> tuple[str, int, int]:
    """(location, size, modification time in ns) of a file: what changes when its content is replaced,
    without reading it (a stored result keyed by an input file must not outlive the file's content)."""
    info = _info(location)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(location)
    return normalize(location), info.size, info.mtime_ns or 0


def open_input(location: str) -> pa.NativeFile:
    """A random-access reader (Parquet footers and Arrow IPC batches are read by range)."""
    fs, path = filesystem(location)
    return fs.open_input_file(path)


def open_stream(location: str) -> pa.NativeFile:
    """A sequential reader: fewer requests than open_input for reading a whole object. Buffered, so
    reading lines or small records (warcio reads 16 KB) is not one store request each; the bytes as
    stored: pyarrow would otherwise gunzip a .gz name (a .warc.gz, a fingerprint) in silence."""
    fs, path = filesystem(location)
    return fs.open_input_stream(path, compression=None, buffer_size=STREAM_BUFFER)


@contextlib.contextmanager
def open_output(location: str) -> Iterator[pa.NativeFile]:
    """Write `location` whole or not at all.

    Locally the bytes go to a hidden temporary file renamed into place at the end. An object
    store publishes an object only when its upload completes; pyarrow cannot abort an upload, so
    after an exception the object is deleted again. Readers trust a dataset's manifest, which is
    written last, so they never list a file mid-write either way.
    """
    location = normalize(location)
    fs, path = filesystem(location)
    if not is_remote(location):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            with fs.open_output_stream(tmp, compression=None) as out:
                yield out
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
        return
    out = fs.open_output_stream(path, compression=None)  # as given, also for a .gz name
    try:
        yield out
    except BaseException:
        with contextlib.suppress(Exception):
            out.close()
            fs.delete_file(path)
        raise
    out.close()


def read_bytes(location: str) -> bytes:
    with open_stream(location) as fh:
        return fh.read()


def write_bytes(location: str, data: bytes) -> None:
    with open_output(location) as out:
        out.write(data)


def read_json(location: str) -> Any:
    return json.loads(read_bytes(location).decode("utf-8"))


def write_json(location: str, value: Any) -> None:
    write_bytes(location, (json.dumps(value, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def list_files(location: str) -> list[tuple[str, int]]:
    """(path relative to `location`, '/'-separated, size) of every file under it, sorted; [] if it is
    absent. A local folder is walked without following symlinked folders, so a link loop stays finite."""
    return [(rel, size) for rel, size, _ in file_infos(location)]


def file_infos(location: str) -> list[tuple[str, int, float]]:
    """(relative path, size, modification time in epoch seconds) of every file under `location`,
    sorted; [] if it is absent. For stores the time is the object's last-modified time."""
    if not is_remote(location):
        root = normalize(location)
        found = []
        for d, _, names in os.walk(root):
            for name in names:
                full = os.path.join(d, name)
                try:
                    st = os.stat(full)
                except FileNotFoundError:  # removed by a concurrent prune or writer
                    continue
                if not os.path.isfile(full):
                    continue
                found.append((os.path.relpath(full, root).replace(os.sep, "/"), st.st_size, st.st_mtime))
        return sorted(found)
    fs, path = filesystem(location)
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    base = path.rstrip("/") + "/"
    return sorted((i.path[len(base):], i.size, i.mtime.timestamp() if i.mtime else 0.0) for i in infos
                  if i.type == pafs.FileType.File and i.path.startswith(base))


def delete_tree(location: str) -> None:
    """Remove a folder (a prefix) and everything under it; absent is fine."""
    fs, path = filesystem(location)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        fs.delete_file(path)
    elif info.type == pafs.FileType.Directory or is_remote(location):
        with contextlib.suppress(FileNotFoundError):
            fs.delete_dir(path)


def delete_file(location: str) -> None:
    fs, path = filesystem(location)
    with contextlib.suppress(FileNotFoundError):
        fs.delete_file(path)


def _pattern_regex(pattern: str) -> re.Pattern:
    """A glob over keys: `*` and `?` stay inside one path segment, `**` crosses segments."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            if pattern.startswith("/", i):
                out[-1] = "(?:.*/)?"
                i += 1
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape("["))
                i += 1
            else:
                out.append(fnmatch.translate(pattern[i:end + 1])[4:-3])
                i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def has_magic(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def glob(pattern: str) -> list[str]:
    """Locations matching a pattern, sorted; a location without wildcards matches itself if it exists."""
    pattern = os.fspath(pattern)
    if not is_remote(pattern):
        local = os.path.expanduser(pattern.removeprefix("file://"))
        return sorted(os.path.abspath(p) for p in _glob.glob(local, recursive=True))
    pattern = normalize(pattern)
    if not has_magic(pattern):
        return [pattern] if is_file(pattern) else []
    head = pattern[:min(pattern.find(c) for c in "*?[" if c in pattern)]
    base = head.rsplit("/", 1)[0]
    if "://" not in base or not _SCHEME.sub("", base):
        raise StorageError(f"{pattern}: a bucket name cannot hold wildcards")
    regex = _pattern_regex(pattern[len(base) + 1:])
    return [join(base, rel) for rel, _ in list_files(base) if regex.match(rel)]


def store_error(location: str, exc: BaseException) -> StorageError:
    """A one-line StorageError that names the likely cause of a failed store request."""
    text = " ".join(str(exc).split())
    low = text.lower()
    kind = scheme(location)
    if any(s in low for s in ("couldn't connect", "could not connect", "connection refused", "failed to connect",
                              "curl error", "timed out", "timeout", "resolve host", "unavailable")):
        where = (os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS S3"
                 if kind == "s3" else os.environ.get("STORAGE_EMULATOR_HOST") or "Google Cloud Storage")
        var = "AWS_ENDPOINT_URL" if kind == "s3" else "STORAGE_EMULATOR_HOST"
        return StorageError(f"{location}: cannot reach the store at {where} ({text[:160]}); "
                            f"check the network and {var}")
    if any(s in low for s in ("access denied", "accessdenied", "forbidden", "invalidaccesskeyid",
                              "signaturedoesnotmatch", "credentials", "unauthorized", "permission")):
        how = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE" if kind == "s3"
               else "set GOOGLE_APPLICATION_CREDENTIALS or run `gcloud auth application-default login`")
        return StorageError(f"{location}: access denied by the store ({text[:160]}); {how}")
    if "nosuchbucket" in low or "bucket does not exist" in low or "not found" in low and "bucket" in low:
        return StorageError(f"{location}: bucket {bucket(location)!r} does not exist; create it first")
    return StorageError(f"{location}: store request failed: {text[:240]}")


def aws_credentials_found() -> bool:
    """Whether the AWS credential chain has a source: variables, a profile file, a web identity or
    container role, or the instance metadata service (unless AWS_EC2_METADATA_DISABLED)."""
    env = os.environ
    if env.get("AWS_ACCESS_KEY_ID") or env.get("AWS_PROFILE") or env.get("AWS_WEB_IDENTITY_TOKEN_FILE") \
            or env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") or env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        return True
    for var, default in (("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"), ("AWS_CONFIG_FILE", "~/.aws/config")):
        if os.path.isfile(os.path.expanduser(env.get(var, default))):
            return True
    return env.get("AWS_EC2_METADATA_DISABLED", "").lower() != "true"


def bucket(location: str) -> str:
    return _SCHEME.sub("", normalize(location)).split("/", 1)[0]


def check_writable(location: str) -> None:
    """Fail fast, before any pipeline starts, when `location` cannot take output: an unknown scheme,
    an unreachable endpoint, missing credentials or bucket. Writes and deletes one small object."""
    location = normalize(location)
    if not is_remote(location):
        probe_dir = location
        while not os.path.exists(probe_dir):
            probe_dir = os.path.dirname(probe_dir)
        if not os.access(probe_dir, os.W_OK):
            raise StorageError(f"{location}: {probe_dir} is not writable")
        return
    if scheme(location) == "s3" and not aws_credentials_found():
        raise StorageError(f"{location}: no AWS credentials found; set AWS_ACCESS_KEY_ID and "
                           f"AWS_SECRET_ACCESS_KEY, or AWS_PROFILE")
    fs, path = filesystem(location, attempts=2)
    try:
        if fs.get_file_info(bucket(location)).type == pafs.FileType.NotFound:
            raise StorageError(f"{location}: bucket {bucket(location)!r} does not exist; create it first")
        probe = f"{path}/_shardsmith-probe-{uuid.uuid4().hex[:8]}"
        with fs.open_output_stream(probe) as out:
            out.write(b"ok")
        fs.delete_file(probe)
    except StorageError:
        raise
    except (OSError, pa.ArrowException) as exc:
        raise store_error(location, exc) from None


def check_readable(location: str) -> None:
    """Fail fast when `location` cannot be read: as check_writable, without writing."""
    location = normalize(location)
    if not is_remote(location):
        return
    fs, path = filesystem(location, attempts=2)
    try:
        if fs.get_file_info(bucket(location)).type == pafs.FileType.NotFound:
            raise StorageError(f"{location}: bucket {bucket(location)!r} does not exist")
        fs.get_file_info(path)
    except StorageError:
        raise
    except (OSError, pa.ArrowException) as exc:
        raise store_error(location, exc) from None


@contextlib.contextmanager
def local_copy(location: str, suffix: str = "") -> Iterator[str]:
    """A local path holding `location`'s bytes, for libraries that read only local files (open3d,
    warcio's seekable readers); a local location is used in place."""
    if not is_remote(location):
        yield normalize(location)
        return
    import tempfile
    fd, tmp = tempfile.mkstemp(suffix=suffix or os.path.splitext(basename(location))[1])
    try:
        with os.fdopen(fd, "wb") as out, open_stream(location) as src:
            while chunk := src.read(1 << 22):
                out.write(chunk)
        yield tmp
    finally:
        with contextlib.suppress(OSError):
            os.remove(tmp)
