"""The interruption watcher against a local IMDSv2 server."""

from __future__ import annotations

import socket
import time

from raytrain.cloud.interruption import Ec2Metadata, Watcher
from raytrain.testing.imds_server import MetadataServer
from raytrain.testing.ray_service import wait_for


def test_imdsv2_notices_reach_the_watcher() -> None:
    server = MetadataServer()
    try:
        source = Ec2Metadata(server.url)
        assert source.poll() is None  # 404 for both until a notice exists
        server.recommend_rebalance()
        watcher = Watcher(source, interval_s=0.05).start()
        wait_for(lambda: watcher.rebalance is not None, 5, "the rebalance recommendation")
        assert watcher.take_checkpoint_request() and not watcher.take_checkpoint_request()
        assert not watcher.stop_requested
        server.interrupt()
        wait_for(lambda: watcher.stop_requested, 5, "the interruption notice")
        assert '"action": "terminate"' in watcher.interruption.detail
        assert time.time() - watcher.interruption.received_at < 5
        # A stale token is replaced: the server forgets it, the next poll takes a new one.
        server.tokens.clear()
        assert source.poll() is not None
    finally:
        server.close()


def test_no_metadata_service_means_no_watching() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    watcher = Watcher(Ec2Metadata(closed, timeout_s=0.2), interval_s=0.05).start()
    watcher._thread.join(timeout=5)  # noqa: SLF001 - the thread ends on its own
    assert not watcher._thread.is_alive() and not watcher.stop_requested  # noqa: SLF001
