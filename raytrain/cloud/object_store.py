"""Where a service keeps what must outlive its nodes (checkpoints, worker logs, a copy of its
job records): a local folder, or an S3-compatible bucket (AWS, R2, B2, MinIO, RunPod's S3 API).

    store = open_store("s3://bucket/prefix")        # or "/mnt/shared/raytrain", "~/.raytrain/jobs"
    store.put_bytes("ab12/meta.json", b"{}"); store.get_bytes("ab12/meta.json")
    store.put_file(Path("/tmp/x"), "ab12/checkpoints/step_000000050/__0_0.distcp")

Keys are '/'-separated under the store's root. S3 goes through boto3 with the standard
credential chain (environment, profile, instance role) and endpoint (`AWS_ENDPOINT_URL_S3`,
else `AWS_ENDPOINT_URL`, else an explicit one); nothing secret is kept or logged here, and a
store describes itself (`str(store)`) by its URI alone.

Why boto3 and not DCP's fsspec writer over s3fs: s3fs needs aiobotocore, whose botocore pin is
older than the boto3 this package already uses for AWS's APIs (installing it downgrades
botocore under boto3). Checkpoints are written by DCP to a local staging folder and uploaded
from there (raytrain.train.checkpoint), which is also what lets the upload run behind the
training loop.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import Any, Iterator, Protocol

from raytrain.errors import FieldError, SpecError, StoreError
from raytrain.spec.hf_model import FOLDER_READERS

RETRIES = 5


class Store(Protocol):
    uri: str

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def get_bytes(self, key: str) -> bytes | None: ...  # None: no such key

    def get_range(self, key: str, offset: int, length: int) -> bytes: ...  # of a key there

    def put_file(self, path: Path, key: str) -> None: ...

    def get_file(self, key: str, path: Path) -> bool: ...  # False: no such key

    def keys(self, prefix: str) -> Iterator[str]: ...  # every key under the prefix

    def delete_prefix(self, prefix: str) -> None: ...

    # A version tag of a key's content, and a write only if it is still that version: what
    # makes the service's lease atomic (serve.jobs.durable).
    def get_tagged(self, key: str) -> tuple[bytes | None, str | None]: ...

    def put_if(self, key: str, data: bytes, tag: str | None) -> str | None: ...
    # the new tag, or None when the key's version is not `tag` (None: when the key exists)


def is_remote(uri: str | None) -> bool:
    return bool(uri) and str(uri).startswith("s3://")


def join(uri: str | Path, *parts: str) -> str:
    """`uri` with `parts` below it: a folder path, or an s3:// key prefix."""
    return "/".join([str(uri).rstrip("/"), *parts])


def parent(uri: str | Path) -> str:
    return str(uri).rstrip("/").rpartition("/")[0] or "."


def open_store(uri: str, endpoint: str | None = None, check: bool = False) -> Store:
    """The store at `uri` (a folder, or s3://bucket[/prefix]); `check`: fail now, naming the
    fix, if it cannot be written (no bucket, no credentials, access denied, no endpoint)."""
    store: Store = S3Store(uri, endpoint) if is_remote(uri) else LocalStore(uri)
    if check:
        probe = f"_service/probe-{os.getpid()}"
        try:
            store.put_bytes(probe, b"ok")
            store.get_bytes(probe)
            store.delete_prefix(probe)
        except StoreError as exc:
            raise SpecError([FieldError(("storage_path",), str(exc))], "service config") from exc
    return store


class LocalStore:
    """A folder (a local disk, or a shared filesystem every node mounts)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser()
        self.uri = str(self.root)

    def __str__(self) -> str:
        return self.uri

    def _path(self, key: str) -> Path:
        return self.root / key

    def put_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        try:
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            raise StoreError(self.uri, f"writing {key}", exc) from exc

    def get_bytes(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(self.uri, f"reading {key}", exc) from exc

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        try:
            with open(self._path(key), "rb") as handle:
                handle.seek(offset)
                return handle.read(length)
        except OSError as exc:
            raise StoreError(self.uri, f"reading {key}", exc) from exc

    def put_file(self, path: Path, key: str) -> None:
        target = self._path(key)
        if target.resolve() == path.resolve():
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)

    def get_file(self, key: str, path: Path) -> bool:
        source = self._path(key)
        if not source.exists():
            return False
        if source.resolve() != path.resolve():
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, path)
        return True

    def keys(self, prefix: str) -> Iterator[str]:
        if not self.root.is_dir():
            return
        base = self._path(prefix)
        folder = base if base.is_dir() else base.parent
        if not folder.exists():
            return
        for path in sorted(folder.rglob("*")):
            key = path.relative_to(self.root).as_posix()
            if path.is_file() and key.startswith(prefix) and ".tmp" not in path.name \
                    and not path.name.endswith(".lock"):
                yield key

    def delete_prefix(self, prefix: str) -> None:
        path = self._path(prefix)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink(missing_ok=True)

    def get_tagged(self, key: str) -> tuple[bytes | None, str | None]:
        data = self.get_bytes(key)
        return data, None if data is None else hashlib.sha256(data).hexdigest()

    def put_if(self, key: str, data: bytes, tag: str | None) -> str | None:
        """Under an exclusive lock on the key's lock file, so processes on this host (or on
        a filesystem with working locks) agree."""
        import fcntl

        lock = self._path(key).with_name(self._path(key).name + ".lock")
        lock.parent.mkdir(parents=True, exist_ok=True)
        with open(lock, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            if self.get_tagged(key)[1] != tag:
                return None
            self.put_bytes(key, data)
            return hashlib.sha256(data).hexdigest()


class S3Store:
    """A prefix of an S3-compatible bucket, through boto3 (module doc)."""

    def __init__(self, uri: str, endpoint: str | None = None) -> None:
        import boto3
        from botocore.config import Config

        rest = uri[len("s3://"):]
        self.bucket, _, prefix = rest.partition("/")
        if not self.bucket:
            raise SpecError([FieldError(("storage_path",), f"{uri!r} names no bucket. To fix: "
                                        "write s3://BUCKET or s3://BUCKET/PREFIX")],
                            "service config")
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self.endpoint = endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or \
            os.environ.get("AWS_ENDPOINT_URL")
        # A session of its own: boto3's default one is not safe to share between threads,
        # and it would keep the credentials it first found.
        self._client = boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint,
            config=Config(retries={"max_attempts": RETRIES, "mode": "standard"},
                          connect_timeout=5, read_timeout=60))

    def __str__(self) -> str:
        return self.uri

    def __reduce__(self) -> tuple[Any, ...]:  # a client does not pickle: rebuild it there
        return (S3Store, (self.uri, self.endpoint))

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, what: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return call(*args, **kwargs)
        except ClientError as exc:
            raise StoreError(self.uri, what, exc, _s3_fix(exc)) from exc
        except BotoCoreError as exc:
            raise StoreError(self.uri, what, exc, _s3_fix(exc)) from exc

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call(f"writing {key}", self._client.put_object, Bucket=self.bucket,
                   Key=self._key(key), Body=data)

    def get_bytes(self, key: str) -> bytes | None:
        from botocore.exceptions import ClientError

        try:
            answer = self._client.get_object(Bucket=self.bucket, Key=self._key(key))
            return answer["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise StoreError(self.uri, f"reading {key}", exc, _s3_fix(exc)) from exc
        except Exception as exc:  # botocore's transport errors
            raise StoreError(self.uri, f"reading {key}", exc, _s3_fix(exc)) from exc

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        """One ranged GET: bytes [offset, offset + length) of the object."""
        if length <= 0:
            return b""
        answer = self._call(f"reading {key}", self._client.get_object, Bucket=self.bucket,
                            Key=self._key(key), Range=f"bytes={offset}-{offset + length - 1}")
        data: bytes = self._call(f"reading {key}", answer["Body"].read)
        return data

    def put_file(self, path: Path, key: str) -> None:
        self._call(f"uploading {key}", self._client.upload_file, str(path), self.bucket,
                   self._key(key))

    def get_file(self, key: str, path: Path) -> bool:
        data = self.get_bytes(key)
        if data is None:
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return True

    def get_tagged(self, key: str) -> tuple[bytes | None, str | None]:
        from botocore.exceptions import ClientError

        try:
            answer = self._client.get_object(Bucket=self.bucket, Key=self._key(key))
            return answer["Body"].read(), str(answer["ETag"])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None, None
            raise StoreError(self.uri, f"reading {key}", exc, _s3_fix(exc)) from exc
        except Exception as exc:  # botocore's transport errors
            raise StoreError(self.uri, f"reading {key}", exc, _s3_fix(exc)) from exc

    def put_if(self, key: str, data: bytes, tag: str | None) -> str | None:
        """S3's conditional write: If-None-Match: * to create, If-Match: ETag to replace;
        412 (or 409, a concurrent conditional write) when another writer came first."""
        from botocore.exceptions import ClientError

        condition = {"IfNoneMatch": "*"} if tag is None else {"IfMatch": tag}
        try:
            answer = self._client.put_object(Bucket=self.bucket, Key=self._key(key),
                                             Body=data, **condition)
        except ClientError as exc:
            code = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in (409, 412) or exc.response.get("Error", {}).get("Code") in (
                    "PreconditionFailed", "ConditionalRequestConflict"):
                return None
            raise StoreError(self.uri, f"writing {key}", exc, _s3_fix(exc)) from exc
        except Exception as exc:  # botocore's transport errors
            raise StoreError(self.uri, f"writing {key}", exc, _s3_fix(exc)) from exc
        return str(answer["ETag"])

    def keys(self, prefix: str) -> Iterator[str]:
        paginator = self._client.get_paginator("list_objects_v2")
        full = self._key(prefix)
        cut = len(self.prefix) + 1 if self.prefix else 0
        pages = self._call(f"listing {prefix}", lambda: list(paginator.paginate(
            Bucket=self.bucket, Prefix=full)))
        for page in pages:
            for item in page.get("Contents", []):
                yield item["Key"][cut:]

    def delete_prefix(self, prefix: str) -> None:
        keys = list(self.keys(prefix))
        for start in range(0, len(keys), 1000):
            batch = [{"Key": self._key(k)} for k in keys[start:start + 1000]]
            self._call(f"deleting {prefix}", self._client.delete_objects, Bucket=self.bucket,
                       Delete={"Objects": batch, "Quiet": True})


def _s3_fix(exc: BaseException) -> str:
    """How to fix what S3 (or the way to it) answered."""
    code = getattr(exc, "response", {}).get("Error", {}).get("Code", "") \
        if hasattr(exc, "response") else ""
    text = str(exc)
    if code == "NoSuchBucket":
        return "create the bucket, or correct the bucket's name in storage_path"
    if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return ("give these credentials read and write on the bucket, or set the right ones "
                "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or an instance role)")
    if "Unable to locate credentials" in text or "NoCredentials" in type(exc).__name__:
        return ("set credentials for the bucket: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                "AWS_PROFILE, or an instance role")
    if "Could not connect" in text or "EndpointConnectionError" in type(exc).__name__ or \
            "timed out" in text:
        return ("check the endpoint (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL or "
                "--storage-endpoint) and that it answers from this machine")
    return "check the bucket, the credentials and the endpoint"


def with_retries(what: Any, attempts: int = RETRIES, first_s: float = 1.0) -> Any:
    """Call `what()` again after StoreError, waiting 1, 2, 4 ... s; the last error raises."""
    for attempt in range(attempts):
        try:
            return what()
        except StoreError:
            if attempt == attempts - 1:
                raise
            time.sleep(first_s * 2 ** attempt)
    return None


def _read_file(folder: str, name: str) -> bytes | None:
    """A file of a model folder in a bucket (raytrain.spec.hf_model.FOLDER_READERS)."""
    return open_store(folder).get_bytes(name)


FOLDER_READERS["s3"] = _read_file


COMMIT_MARKER = "COMMITTED"  # a checkpoint's last file (raytrain.train.checkpoint writes it)


def checkpoint_committed(ref: str, endpoint: str | None = None) -> tuple[bool, str]:
    """Whether the checkpoint at `ref` (a folder, or s3://BUCKET/.../step_N) is committed (its
    marker written last), and if not, why not. Torch-free: the service's admission asks it
    too, where the checkpoint module (torch) is not imported."""
    if not is_remote(ref):
        found = (Path(ref).expanduser() / COMMIT_MARKER).is_file()
        return found, "" if found else "no COMMITTED marker in that folder on this node"
    folder, _, name = ref.rstrip("/").rpartition("/")
    try:
        marker = open_store(folder, endpoint).get_bytes(f"{name}/{COMMIT_MARKER}")
    except StoreError as exc:
        return False, str(exc)
    return marker is not None, "" if marker is not None else "no COMMITTED marker there"
