"""A local S3 server for tests: moto's server mode on 127.0.0.1, spoken to over HTTP through
boto3 like any S3-compatible service (R2, MinIO), with throwaway credentials.

    with s3_server() as endpoint:          # also sets AWS_ENDPOINT_URL_S3 and credentials
        make_bucket(endpoint, "jobs")
        store = open_store("s3://jobs/prefix")
"""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from typing import Iterator

ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
       "AWS_DEFAULT_REGION": "us-east-1"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def s3_server() -> Iterator[str]:
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    saved = {key: os.environ.get(key) for key in [*ENV, "AWS_ENDPOINT_URL_S3"]}
    os.environ.update({**ENV, "AWS_ENDPOINT_URL_S3": endpoint})
    try:
        yield endpoint
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def make_bucket(endpoint: str, name: str) -> None:
    import boto3

    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=name)


@contextmanager
def job_storage(kind: str, prefix: str) -> Iterator[dict[str, str]]:
    """A service's storage settings for a test: {} (its state folder) for "folder", or a
    bucket on a local S3 server for "bucket", under a prefix of the test's own (moto keeps
    one store per process, across its servers)."""
    if kind == "folder":
        yield {}
        return
    with s3_server() as endpoint:
        make_bucket(endpoint, "jobs")
        yield {"storage_path": f"s3://jobs/{prefix}", "storage_endpoint": endpoint}
