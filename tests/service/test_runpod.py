"""RunPod: the API client, the offers it refreshes and the Ray node provider, against a local
fake of RunPod's REST API v2 (and the GraphQL query still used, spot prices) over real HTTP
(raytrain/testing/runpod_api.py); the cluster config against Ray's schema and ours; and the policy
keeping a job on one on-demand pod."""

from __future__ import annotations

import copy
import logging
import shlex
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from ray.autoscaler.tags import TAG_RAY_NODE_KIND, TAG_RAY_NODE_STATUS, TAG_RAY_USER_NODE_TYPE

from raytrain.cloud import runpod
from raytrain.cloud.cluster_configs import (
    check_cluster_config,
    node_type_bindings,
    pod_types,
    validate_with_ray,
)
from raytrain.cloud.runpod import (
    NoCapacity,
    PodRequest,
    RunPodAPI,
    RunPodAuthError,
    RunPodRetired,
    RunPodUnavailable,
    api_key,
)
from raytrain.cloud.runpod_offers import refresh
from raytrain.cloud.runpod_provider import RunPodNodeProvider
from raytrain.core.autoscale import options
from raytrain.core.throughput import job_goal, job_throughput
from raytrain.errors import SpecError
from raytrain.spec import JobSpec
from raytrain.spec.files import load_policies, snapshot
from raytrain.testing.jobs import gpt_1b_job
from raytrain.testing.ray_service import wait_for
from raytrain.testing.runpod_api import FakeRunPod

REPO = Path(__file__).resolve().parents[2]
RTX4090 = "NVIDIA GeForce RTX 4090"
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def fake() -> Iterator[FakeRunPod]:
    with FakeRunPod(stock={RTX4090: 8, H100: 8, "NVIDIA RTX A4000": 1}) as server:
        yield server


@pytest.fixture
def api(fake: FakeRunPod) -> Iterator[RunPodAPI]:
    # A ceiling far above the fake's answers, so that a busy machine cannot turn a slow answer
    # into a kept price; the tests of late answers use `hurried` below.
    client = RunPodAPI(fake.key, url=fake.url, rest_url=fake.rest_url, timeout_s=30.0)
    yield client
    client.close()


@pytest.fixture
def hurried(fake: FakeRunPod) -> Iterator[RunPodAPI]:
    """A client that gives up after 2 s, for the tests of answers that come too late (the fake
    then answers 4 s late)."""
    client = RunPodAPI(fake.key, url=fake.url, rest_url=fake.rest_url, timeout_s=2.0)
    yield client
    client.close()


def pod(gpu: str = RTX4090, count: int = 1, **kw: object) -> PodRequest:
    return PodRequest(name="t", image="img", gpu_type_id=gpu, gpu_count=count,
                      **kw)  # type: ignore[arg-type]


def test_pods_are_bought_through_rest_v2_and_listed_and_terminated(
        fake: FakeRunPod, api: RunPodAPI) -> None:
    one = api.create(pod(env={"A": "1"}, command="ray start --block"))
    two = api.create(pod(count=2))
    assert one["cost"] == 0.59 and two["cost"] == 1.18 and one["status"] == "PROVISIONING"
    created = [r["body"] for r in fake.requests if r.get("rest") == "POST /v2/pods"]
    # v2's nested create: the GPU as {id, count}, env an object, on the global network.
    assert created[0] == {"name": "t", "image": "img", "gpu": {"id": RTX4090, "count": 1},
                          "cloud": "SECURE", "disk": 50, "ports": ["22/tcp"],
                          "env": {"A": "1"}, "globalNetworking": True,
                          "args": "bash -c 'ray start --block'"}
    assert runpod.pod_env(one) == {"A": "1"}
    listed = {p["id"]: p for p in api.pods()}
    assert set(listed) == {one["id"], two["id"]}
    assert listed[one["id"]]["status"] == "RUNNING"  # the fake boots at once by default
    assert runpod.pod_private_ip(listed[one["id"]]) == "127.0.0.1"
    assert fake.stock[RTX4090] == 5
    api.terminate(two["id"])
    api.terminate(two["id"])  # already gone: no error
    assert [p["id"] for p in api.pods()] == [one["id"]] and fake.stock[RTX4090] == 7


def test_a_v1_body_is_refused_and_a_retired_api_says_so(fake: FakeRunPod,
                                                       api: RunPodAPI) -> None:
    """A v1 field name in a create is a 422 naming it, as v2 answers; a call to REST v1 is
    410 Gone, which the client reports as a retired API, never as a silent fallback."""
    with pytest.raises(runpod.RunPodError, match="imageName.*create_input") as refused:
        api.create(pod(extra={"imageName": "img"}))
    assert "422" not in str(refused.value) or "field" in str(refused.value)
    v1 = RunPodAPI(fake.key, url=fake.url, rest_url=fake.v1_url)
    with pytest.raises(RunPodRetired, match="retired.*REST API v2.*upgrade raytrain"):
        v1.pods()
    assert not fake.pods


def test_every_bad_answer_is_a_clear_error_in_time_and_never_shows_the_key(
        fake: FakeRunPod, api: RunPodAPI, hurried: RunPodAPI,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    fake.stock[H100] = 0
    with pytest.raises(NoCapacity, match="no machine"):
        api.create(pod(gpu=H100, count=8))
    fake.balance_usd = 0.0
    with pytest.raises(runpod.RunPodError, match="balance.*add funds"):
        api.create(pod())
    fake.balance_usd = 100.0
    fake.fail_next(status=503)
    with pytest.raises(RunPodUnavailable, match="503"):
        api.pods()
    fake.fail_next(status=502, message="bad gateway", operation="POST /v2/pods")
    with pytest.raises(RunPodUnavailable, match="502"):
        api.create(pod())
    fake.delay_s, fake.delayed = 4.0, 1
    started = time.monotonic()
    with pytest.raises(RunPodUnavailable, match="within 2 s"):
        hurried.gpus()
    assert time.monotonic() - started < 4.0
    wrong = RunPodAPI("rp_wrong_secret", url=fake.url, rest_url=fake.rest_url)
    with pytest.raises(RunPodAuthError, match="RUNPOD_API_KEY") as refused:
        wrong.pods()
    with pytest.raises(RunPodAuthError, match="RUNPOD_API_KEY") as refused_create:
        wrong.create(pod())
    with pytest.raises(RunPodAuthError, match="RUNPOD_API_KEY"):
        wrong.spot_prices()
    for text in (str(refused.value), str(refused_create.value), repr(wrong), caplog.text):
        assert "rp_wrong_secret" not in text and fake.key not in text
    assert not fake.pods  # nothing was bought by any of it


def test_the_client_keeps_to_runpods_rate_limit(fake: FakeRunPod) -> None:
    """Past a used-up window (RateLimit r=0) the client waits for its reset instead of
    spending a request on a 429; a second client on the same key that meets a 429 waits
    Retry-After and asks again. Neither sees an error."""
    fake.quota, fake.window_s = 2, 2.0
    first = RunPodAPI(fake.key, url=fake.url, rest_url=fake.rest_url)
    second = RunPodAPI(fake.key, url=fake.url, rest_url=fake.rest_url)
    try:
        started = time.monotonic()
        first.pods()
        first.pods()  # the window's last request: r=0 comes back
        second.pods()  # 429, Retry-After: it waits for the window and tries again
        first.pods()  # waits out the window it saw used up
        assert time.monotonic() - started >= 1.5
    finally:
        first.close()
        second.close()
    assert fake.failures_pending == 0


def test_the_key_comes_from_the_environment_or_a_file(tmp_path: Path) -> None:
    assert api_key({"RUNPOD_API_KEY": " k1 "}) == "k1"
    config = tmp_path / "config.toml"
    config.write_text('apikey = "k2"\n')
    assert api_key({"RUNPOD_API_KEY_FILE": str(config)}) == "k2"
    with pytest.raises(RunPodAuthError, match="RUNPOD_API_KEY"):
        api_key({"RUNPOD_API_KEY_FILE": str(tmp_path / "none")})


def test_offers_take_runpods_prices_and_keep_the_rest(fake: FakeRunPod, api: RunPodAPI) -> None:
    before = snapshot()
    after = refresh(before, api, now=1_796_200_000.0)
    assert after.warnings == before.warnings  # every RunPod row refreshed, none kept
    rows = {o.id: o for o in after.offers}
    assert rows["runpod/secure/4x-rtx4090"].on_demand_usd_per_hour == pytest.approx(4 * 0.59)
    assert rows["runpod/secure/4x-rtx4090"].spot_usd_per_hour == pytest.approx(4 * 0.34)
    assert rows["runpod/secure/8x-h100-sxm"].spot_usd_per_hour == pytest.approx(8 * 2.09)
    assert "refreshed from RunPod" in rows["runpod/secure/1x-rtx4090"].note
    assert [o for o in after.offers if o.provider == "aws"] == \
        [o for o in before.offers if o.provider == "aws"]
    assert not [o for o in after.offers if o.provider == "gpu-market"]
    assert not rows["runpod/secure/4x-rtx4090"].spot_joins_cluster  # shown, never bought
    assert "spot" not in rows["runpod/secure/4x-rtx4090"].markets()
    # Prices from v2's catalog, spot from GraphQL (v2 has none), nothing else from GraphQL.
    asked = [r["query"] for r in fake.requests if "query" in r]
    assert asked and all("SpotPrices" in q for q in asked)
    fake.fail_next(status=500, operation="GET /v2/catalog")  # the 1-GPU catalog fails
    kept = refresh(before, api, now=1_796_200_000.0)
    one = next(o for o in kept.offers if o.id == "runpod/secure/1x-rtx4090")
    assert one == next(o for o in before.offers if o.id == one.id)
    assert any("kept from before" in w for w in kept.warnings)
    fake.fail_next(status=200, message="rate limited", operation="gpuTypes")
    spot_kept = refresh(before, api, now=1_796_200_000.0)
    one = next(o for o in spot_kept.offers if o.id == "runpod/secure/1x-rtx4090")
    assert one.on_demand_usd_per_hour == pytest.approx(0.59)  # v2's price still taken
    assert one.spot_usd_per_hour == next(o for o in before.offers
                                         if o.id == one.id).spot_usd_per_hour
    assert any("interruptible prices for 1-GPU pods kept" in w for w in spot_kept.warnings)


def provider(fake: FakeRunPod, api: RunPodAPI, tmp_path: Path,
             list_cache_s: float = 10.0) -> RunPodNodeProvider:
    return RunPodNodeProvider({"head_ip": "10.0.0.1", "tags_file": str(tmp_path / "tags.json"),
                               "list_cache_s": list_cache_s}, "rt", api=api)


NODE_CONFIG = {"gpu_type_id": RTX4090, "gpu_count": 2, "interruptible": False,
               "docker_args": "ray start --address={head_ip}:6379 --resources='{resources}'"}
TAGS = {TAG_RAY_NODE_KIND: "worker", TAG_RAY_USER_NODE_TYPE: "rtx4090x2-on-demand"}


def test_the_node_provider_keeps_its_nodes_and_tags_on_runpod_across_a_restart(
        fake: FakeRunPod, api: RunPodAPI, tmp_path: Path) -> None:
    """... and asks RunPod for its listing once however many questions the autoscaler asks
    within the cache's time (one create or terminate makes the next one fresh)."""
    nodes = provider(fake, api, tmp_path)
    [node] = nodes.create_node({**NODE_CONFIG, "create_input": {"disk": 80}}, TAGS, 1)
    made = fake.pods[node]
    assert made["gpu"] == {"id": RTX4090, "count": 2} and made["globalNetworking"]
    assert fake.requests[-1]["body"]["disk"] == 80
    assert shlex.split(made["args"]) == ["bash", "-c", "ray start --address=10.0.0.1:6379 "
                                         "--resources='{\"rtx4090x2-on-demand\": 1}'"]
    for refused, fix in (({"deploy_input": {"x": 1}}, "rename it create_input"),
                         ({"interruptible": True}, "cannot join a Ray cluster.*interruptible: "
                          "false"),
                         ({"support_public_ip": True}, "ssh.direct.*remove it")):
        with pytest.raises(runpod.RunPodError, match=fix):
            nodes.create_node({**NODE_CONFIG, **refused}, TAGS, 1)
    assert len(fake.pods) == 1  # none of those bought anything
    on_demand = {TAG_RAY_USER_NODE_TYPE: "rtx4090x2-on-demand"}
    assert nodes.non_terminated_nodes(on_demand) == [node]
    assert nodes.non_terminated_nodes({TAG_RAY_USER_NODE_TYPE: "h100x8-on-demand"}) == []
    assert nodes.node_tags(node)[TAG_RAY_NODE_STATUS] == "up-to-date"
    assert nodes.internal_ip(node) == "127.0.0.1"
    listed = sum(1 for r in fake.requests if r.get("rest") == "GET /v2/pods")
    for _ in range(20):
        nodes.non_terminated_nodes({}), nodes.is_running(node), nodes.node_tags(node)
    assert sum(1 for r in fake.requests if r.get("rest") == "GET /v2/pods") == listed
    nodes.set_node_tags(node, {"later": "yes"})
    fake.requests.clear()
    restarted = provider(fake, api, tmp_path)  # a new autoscaler: only RunPod and the file
    workers = {TAG_RAY_NODE_KIND: "worker"}
    assert restarted.non_terminated_nodes(workers) == [node]
    assert restarted.non_terminated_nodes({TAG_RAY_NODE_KIND: "head"}) == []
    assert restarted.node_tags(node) == {**TAGS, TAG_RAY_NODE_STATUS: "up-to-date",
                                         "later": "yes"}
    other_cluster = RunPodNodeProvider({"head_ip": "10.0.0.1", "tags_file": str(
        tmp_path / "other.json")}, "someone-else", api=api)
    assert other_cluster.non_terminated_nodes(workers) == []
    restarted.terminate_node(node)
    assert fake.pods == {} and restarted.non_terminated_nodes({}) == []
    # A pod whose container stopped holds its disk, billed, and runs no node: the next
    # listing terminates it.
    [stopped] = restarted.create_node(NODE_CONFIG, TAGS, 1)
    fake.exit(stopped)
    assert restarted.non_terminated_nodes(workers) == [] and fake.pods == {}


def test_a_reclaimed_pod_is_gone_and_no_failed_create_leaves_a_pod_running(
        fake: FakeRunPod, hurried: RunPodAPI, tmp_path: Path) -> None:
    nodes = provider(fake, hurried, tmp_path, list_cache_s=0.0)
    [node] = nodes.create_node(NODE_CONFIG, TAGS, 1)
    fake.reclaim(node)  # its host lost, no notice
    workers = {TAG_RAY_NODE_KIND: "worker"}
    assert nodes.is_terminated(node) and nodes.non_terminated_nodes(workers) == []
    fake.stock[RTX4090] = 0
    with pytest.raises(NoCapacity):
        nodes.create_node(NODE_CONFIG, TAGS, 1)
    fake.stock[RTX4090] = 8
    # RunPod makes the pod but answers too late: the provider finds it and terminates it.
    on_demand = NODE_CONFIG
    fake.delay_s, fake.delayed = 4.0, 1
    with pytest.raises(RunPodUnavailable):
        nodes.create_node(on_demand, TAGS, 1)
    assert fake.pods == {}
    # ... and when RunPod cannot even be asked then, the next listing does it.
    fake.delay_s, fake.delayed = 4.0, 2
    with pytest.raises(RunPodUnavailable):
        nodes.create_node(on_demand, TAGS, 1)
    assert len(fake.pods) == 1 and nodes.non_terminated_nodes(workers) == []
    assert fake.pods == {}
    # If RunPod will not terminate it at that listing either, it stays listed (accounted
    # for, billed), and a later listing ends it.
    fake.delay_s, fake.delayed = 4.0, 2
    with pytest.raises(RunPodUnavailable):
        nodes.create_node(on_demand, TAGS, 1)
    [left] = fake.pods
    fake.fail_next(status=503, operation="DELETE /v2/pods")
    assert nodes.non_terminated_nodes(workers) == [left]
    assert nodes.non_terminated_nodes(workers) == [] and fake.pods == {}


HEAD_TAGS = {TAG_RAY_NODE_KIND: "head", TAG_RAY_USER_NODE_TYPE: "head",
             TAG_RAY_NODE_STATUS: "uninitialized"}


def shipped_head_config() -> dict:
    document = yaml.safe_load((REPO / "cluster" / "runpod.yaml").read_text())
    return document["available_node_types"]["head"]["node_config"]


def test_ray_up_makes_the_head_a_pod_that_holds_the_key_and_ray_down_ends_it_last(
        fake: FakeRunPod, api: RunPodAPI, tmp_path: Path) -> None:
    """The head pod, as `ray up` asks for it from cluster/runpod.yaml: on demand, on the
    global network, its SSH port public, the public key for SSH and the API key for its
    autoscaler in its environment (no other pod gets the API key); listed as the head with
    the tags ray up gave it. `ray down` asks for all nodes at once: the head goes last."""
    keys = tmp_path / "id"
    keys.write_text("PRIVATE")
    (tmp_path / "id.pub").write_text("ssh-ed25519 AAAA user@laptop\n")
    config = RunPodNodeProvider.bootstrap_config({
        "provider": {"tags_file": str(tmp_path / "tags.json")},
        "auth": {"ssh_user": "root", "ssh_private_key": str(keys)}})
    nodes = RunPodNodeProvider(config["provider"], "rt", api=api)
    fake.boot_s = 60.0  # RunPod's answer while the pod boots: no SSH yet, Ray waits
    [head] = nodes.create_node(shipped_head_config(), HEAD_TAGS, 1)
    body = fake.requests[-1]["body"]
    assert body["globalNetworking"] is True and body["gpu"]["count"] == 1
    assert body["ports"] == ["22/tcp", "8000/http"] and "args" not in body
    assert body["env"]["PUBLIC_KEY"] == "ssh-ed25519 AAAA user@laptop"
    assert body["env"]["RUNPOD_API_KEY"] == fake.key
    assert nodes.non_terminated_nodes({TAG_RAY_NODE_KIND: "head"}) == [head]
    assert nodes.node_tags(head)[TAG_RAY_NODE_STATUS] == "uninitialized"  # ray up's to set
    assert nodes.ssh_address(head, public=True) is None
    fake.boot_s = 0.0
    [worker] = nodes.create_node(NODE_CONFIG, TAGS, 1)
    assert "RUNPOD_API_KEY" not in fake.requests[-1]["body"]["env"]
    terminated: list[str] = []
    fake.on_terminate = lambda pod: terminated.append(pod["id"])
    nodes.terminate_nodes([head, worker])
    assert fake.pods == {}
    wait_for(lambda: len(terminated) == 2, 10, "both pods' containers to be stopped")
    assert terminated == [worker, head]


@pytest.mark.parametrize("auth, files, error", [
    ({"ssh_user": "root"}, {}, "names no SSH key"),
    ({"ssh_user": "root", "ssh_private_key": "{d}/missing"}, {}, "does not exist"),
    ({"ssh_user": "root", "ssh_private_key": "{d}/id"}, {"id": "PRIVATE"}, "ssh-keygen -y"),
])
def test_ray_up_refuses_a_cluster_without_a_usable_ssh_key_before_buying_anything(
        auth: dict, files: dict, error: str, tmp_path: Path) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    auth = {k: v.format(d=tmp_path) for k, v in auth.items()}
    with pytest.raises(runpod.RunPodError, match=error) as raised:
        RunPodNodeProvider.bootstrap_config({"provider": {}, "auth": auth})
    assert "To fix" in str(raised.value)


def test_what_a_first_user_gets_wrong_about_the_head_is_refused_with_the_fix(
        fake: FakeRunPod, api: RunPodAPI, tmp_path: Path) -> None:
    """No stock for the head's GPU type, data centers without global networking, a
    key RunPod refuses: each is an error that says what to do, and no pod is left."""
    nodes = provider(fake, api, tmp_path)
    head = shipped_head_config()
    fake.stock[head["gpu_type_id"]] = 0
    with pytest.raises(NoCapacity, match="for the head pod now. To fix: name another"):
        nodes.create_node(head, HEAD_TAGS, 1)
    fake.stock[head["gpu_type_id"]] = 1
    no_network = {**head, "create_input": {"dataCenterIds": ["US-TX-3", "US-GA-1"]}}
    creates = len([r for r in fake.requests if r.get("rest") == "POST /v2/pods"])
    with pytest.raises(runpod.RunPodError, match="dataCenterIds") as raised:
        nodes.create_node(no_network, HEAD_TAGS, 1)
    assert "US-GA-1" in str(raised.value) and "EU-RO-1, US-TX-3" in str(raised.value)
    assert len([r for r in fake.requests if r.get("rest") == "POST /v2/pods"]) == creates
    refused = RunPodNodeProvider({"tags_file": str(tmp_path / "t.json")}, "rt",
                                 api=RunPodAPI("wrong", url=fake.url, rest_url=fake.rest_url))
    with pytest.raises(RunPodAuthError, match="To fix"):
        refused.create_node(head, HEAD_TAGS, 1)
    assert fake.pods == {}


def test_rays_command_runner_reaches_a_pod_on_its_mapped_ssh_port_and_copies_files(
        fake: FakeRunPod, api: RunPodAPI, tmp_path: Path) -> None:
    """Ray's SSH runner as the provider hands it out, against a pod of the fake that answers
    SSH on its own port (raytrain/testing/fake_pods.py): commands run there, and files and folders
    go
    up and come back down with no rsync on either side."""
    import subprocess

    from raytrain.testing.fake_pods import PodServers

    key = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    config = RunPodNodeProvider.bootstrap_config({
        "provider": {"tags_file": str(tmp_path / "tags.json")},
        "auth": {"ssh_user": "root", "ssh_private_key": str(key)}})
    pods = PodServers()

    def serve_ssh(pod: dict) -> None:
        pod["ssh_port"] = pods.start(pod["id"], {**runpod.pod_env(pod)}, tmp_path / "pod")

    fake.on_create = serve_ssh
    try:
        nodes = RunPodNodeProvider(config["provider"], "rt", api=api)
        [head] = nodes.create_node(shipped_head_config(), HEAD_TAGS, 1)
        def runner() -> Any:  # a new one for each command, as `ray submit` and the rest take
            return nodes.get_command_runner("test: ", head, config["auth"], "rt", subprocess,
                                            use_internal_ip=False)

        assert runner().run("echo $RUNPOD_API_KEY", with_output=True).decode().strip() == \
            fake.key
        folder = tmp_path / "up"
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "a.txt").write_text("a")
        (tmp_path / "one.txt").write_text("one")
        runner().run_rsync_up(str(folder) + "/", "~/copied/")
        runner().run_rsync_up(str(tmp_path / "one.txt"), "~/deeper/one file.txt")
        assert (tmp_path / "pod" / "copied" / "sub" / "a.txt").read_text() == "a"
        assert (tmp_path / "pod" / "deeper" / "one file.txt").read_text() == "one"
        runner().run_rsync_down("~/copied/", str(tmp_path / "down"))
        runner().run_rsync_down("~/deeper/one file.txt", str(tmp_path / "back.txt"))
        assert (tmp_path / "down" / "sub" / "a.txt").read_text() == "a"
        assert (tmp_path / "back.txt").read_text() == "one"
        port = fake.pods[head]["ssh_port"]
        assert f"-p {port} root@127.0.0.1" in runner().remote_shell_command_str()
    finally:
        pods.close()


def test_the_runpod_cluster_config_passes_rays_schema_and_ours() -> None:
    document = yaml.safe_load((REPO / "cluster" / "runpod.yaml").read_text())
    validate_with_ray(document, fill_defaults=False)
    validate_with_ray(document)
    assert check_cluster_config(document, snapshot()) == []
    bindings = node_type_bindings(document, snapshot())
    assert {(b.offer, b.market) for b in bindings.values()} == {
        (f"runpod/secure/{n}x-rtx4090", "on-demand") for n in (1, 2, 4, 8)} | {
        ("runpod/secure/8x-h100-sxm", "on-demand")}
    broken = copy.deepcopy(document)
    broken["available_node_types"]["rtx4090x2-on-demand"]["node_config"]["gpu_count"] = 3
    [problem] = check_cluster_config(broken, snapshot())
    assert problem.loc[-1] == "gpu_count" and "[1, 2, 4, 8]" in problem.msg
    # The interruptible pods: no Ray node types, each its offer's spot market, one pod a job.
    bindings, pods = pod_types(document, snapshot())
    assert {(b.offer, b.market, b.max_nodes) for b in bindings.values()} == {
        (f"runpod/secure/{n}x-rtx4090", "spot", 1) for n in (1, 2, 4, 8)} | {
        ("runpod/secure/8x-h100-sxm", "spot", 1)}
    assert pods["h100x8-spot"].gpu_type_id == H100 and pods["rtx4090x2-spot"].gpu_count == 2
    assert "raytrain.train.pod_main" in pods["rtx4090x1-spot"].command
    for change, fix in (({"gpu_count": 3}, "no RunPod offer of 3 x"),
                        ({"bid": 1.0}, "Extra inputs")):
        changed = copy.deepcopy(document)
        changed["provider"]["pod_types"]["rtx4090x1-spot"].update(change)
        with pytest.raises(SpecError, match=fix):
            pod_types(changed, snapshot())
    clash = copy.deepcopy(document)
    clash["provider"]["pod_types"]["h100x8-on-demand"] = {"gpu_type_id": H100, "gpu_count": 8}
    with pytest.raises(SpecError, match="also a Ray node type"):
        pod_types(clash, snapshot())
    for key, value, fix in (("deploy_input", {}, "create_input"),
                            ("interruptible", True, "cannot join a Ray cluster"),
                            ("support_public_ip", True, "ssh.direct")):
        changed = copy.deepcopy(document)
        changed["available_node_types"]["h100x8-on-demand"]["node_config"][key] = value
        [problem] = check_cluster_config(changed, snapshot())
        assert problem.loc[-1] == key and fix in problem.msg


def test_the_policy_keeps_a_job_on_one_runpod_pod() -> None:
    spec = JobSpec.model_validate(gpt_1b_job("rtx4090", parallel={"strategy": "auto"}))
    found = options(job_goal(spec), snapshot().offers, job_throughput(spec),
                    load_policies()["cost-first"])
    runpod_options = [o for o in found if o.offer.provider == "runpod"]
    assert {o.offer.gpus_per_node for o in runpod_options} >= {4, 8}
    assert all(o.nodes == 1 for o in runpod_options)  # 100 Mbit/s between pods: never more
