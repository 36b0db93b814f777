"""The AWS edge against moto's EC2 (over real HTTP on 127.0.0.1) and a Pricing API endpoint
that speaks the service's JSON protocol; the offline fallback against a closed port."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest
from moto.server import ThreadedMotoServer

from raytrain.catalog.hardware import CATALOG_VERSION
from raytrain.cloud.aws import Clients, refresh
from raytrain.spec.files import load_offers, save_offers, snapshot

NOW = 1_796_000_000.0  # 2026-11-30
SPOT_PRICES = {"us-east-1a": "31.10", "us-east-1b": "29.85", "us-east-1c": "33.00"}
P5_ON_DEMAND = "55.0400000000"


@pytest.fixture(scope="module")
def moto_url(monkeypatch_module: pytest.MonkeyPatch) -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    patch = pytest.MonkeyPatch()
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        patch.setenv(key, value)
    yield patch
    patch.undo()


class _PricingAPI(BaseHTTPRequestHandler):
    """AWSPriceListService.GetProducts over JSON 1.1: one p5.48xlarge product."""

    requests: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _PricingAPI.requests.append({"target": self.headers["X-Amz-Target"], **body})
        wanted = {f["Field"]: f["Value"] for f in body["Filters"]}
        products = []
        if wanted.get("instanceType") == "p5.48xlarge" and wanted.get("regionCode") == "us-east-1":
            products.append(json.dumps({
                "product": {"attributes": {"instanceType": "p5.48xlarge"}},
                "terms": {"OnDemand": {"T1": {"priceDimensions": {"D1": {
                    "unit": "Hrs", "pricePerUnit": {"USD": P5_ON_DEMAND}}}}}},
            }))
        payload = json.dumps({"FormatVersion": "aws_v1", "PriceList": products}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def pricing_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _PricingAPI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _inject_spot_prices(clients: Clients) -> None:
    """moto answers every spot price as 0.00001: put zone prices in its answers."""

    def rewrite(parsed: dict[str, Any], **_: Any) -> None:
        for item in parsed.get("SpotPriceHistory", []):
            item["SpotPrice"] = SPOT_PRICES.get(item["AvailabilityZone"], "99.0")

    clients.ec2.meta.events.register("after-call.ec2.DescribeSpotPriceHistory", rewrite)


def test_refresh_takes_prices_and_facts_from_aws(moto_url: str, pricing_url: str) -> None:
    clients = Clients.create("us-east-1", endpoint_url=moto_url, pricing_endpoint_url=pricing_url)
    _inject_spot_prices(clients)
    before = snapshot()
    after = refresh(before, clients, "us-east-1", now=NOW)
    p5 = after.find("aws/us-east-1/p5.48xlarge")
    assert p5 is not None
    assert p5.on_demand_usd_per_hour == pytest.approx(55.04)
    assert (p5.spot_usd_per_hour, p5.spot_zone) == (29.85, "us-east-1b")  # the cheapest zone
    assert (p5.gpus_per_node, p5.network_gbps, p5.rdma) == (8, 3200, True)  # moto's p5 facts
    assert after.source == "aws" and after.fetched_at == NOW and after.version == CATALOG_VERSION
    # g6e has no product in the fake Pricing API: warned, previous price kept.
    g6e = after.find("aws/us-east-1/g6e.12xlarge")
    assert g6e is not None and g6e.on_demand_usd_per_hour == 10.493
    assert any("g6e.12xlarge" in w for w in after.warnings)
    # Other providers' offers pass through untouched.
    rtx4090 = "runpod/secure/8x-rtx4090"
    assert after.find(rtx4090) == before.find(rtx4090) and before.find(rtx4090) is not None
    assert _PricingAPI.requests[0]["target"] == "AWSPriceListService.GetProducts"


def test_unreachable_aws_keeps_the_snapshot_with_warnings(
    tmp_path: Any, monkeypatch_module: pytest.MonkeyPatch
) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    clients = Clients.create("us-east-1", endpoint_url=closed)
    before = snapshot()
    after = refresh(before, clients, "us-east-1", now=NOW)
    assert [o.model_dump() for o in after.offers] == [
        o.model_dump() for o in before.offers]  # every figure kept
    assert after.warnings and all("To fix" in w for w in after.warnings)
    assert any("EndpointConnectionError" in w for w in after.warnings)
    # The refreshed catalog round-trips through the cache; a broken cache falls back.
    save_offers(after, tmp_path)
    assert load_offers(tmp_path) == after
    (tmp_path / "offers.json").write_text("{not json")
    fallback = load_offers(tmp_path)
    assert fallback.source == "snapshot" and "unreadable" in fallback.warnings[0]
