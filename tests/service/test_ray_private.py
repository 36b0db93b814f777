"""The private Ray APIs raytrain still uses, each where no public one does the job (the
comment at each use says why), checked against the installed Ray: a Ray upgrade that moves
or changes one fails here, not in a cluster. Everything else raytrain calls is Ray's public
API (`ray.PlacementGroupID`, `ray.util.get_node_ip_address`, ...)."""

from __future__ import annotations

import ast
import inspect
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# module -> the names raytrain takes from it
PRIVATE_USES = {
    "ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator":
        {"get_or_create_autoscaling_coordinator"},
    "ray.data._internal.cluster_autoscaler.base_autoscaling_coordinator":
        {"ResourceRequestPriority"},
    "ray.autoscaler._private.util": {"prepare_config", "validate_config"},
    # The SSH runner a node provider hands out (NodeProvider.get_command_runner), for RunPod's
    # mapped SSH port (raytrain/cloud/runpod_ssh.py).
    "ray.autoscaler._private.command_runner": {"SSHCommandRunner"},
    # The function that starts Ray's dashboard process, wrapped so that process probes no
    # cloud (raytrain/serve/adaptors/ray_probe.py); the one-machine flag this process's Ray read at
    # import (raytrain/serve/deploy.py, one_machine).
    "ray._private": {"services", "ray_constants"},
}


def test_raytrain_uses_no_private_ray_module_but_the_listed_ones() -> None:
    """Every import in raytrain/, those inside functions too."""
    used: dict[str, set[str]] = {}
    for path in (ROOT / "raytrain").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and _private(node.module):
                used.setdefault(node.module, set()).update(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                assert not [a.name for a in node.names if _private(a.name)], path
    assert used == PRIVATE_USES


def _private(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "ray" and any(part.startswith("_") for part in parts)


def test_the_autoscaling_coordinator_takes_what_raytrain_sends() -> None:
    from ray.data._internal.cluster_autoscaler.base_autoscaling_coordinator import (
        ResourceRequestPriority,
    )
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        _AutoscalingCoordinatorActor,
        get_or_create_autoscaling_coordinator,
    )

    assert callable(get_or_create_autoscaling_coordinator)
    request = inspect.signature(_AutoscalingCoordinatorActor.request_resources).parameters
    assert {"requester_id", "resources", "expire_after_s", "priority"} <= set(request)
    assert list(inspect.signature(_AutoscalingCoordinatorActor.cancel_request).parameters) == [
        "self", "requester_id"]
    assert ResourceRequestPriority.HIGH.value > ResourceRequestPriority.MEDIUM.value
    # A Ray Train run's own request, withdrawn by raytrain.train.elastic_launcher for a fit
    # left starting: its requester id, and the trainer's run id known before fit().
    from ray.train.v2._internal.execution.scaling_policy.scaling_policy import ScalingPolicy
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    assert 'f"train-{train_run_context.run_id}"' in inspect.getsource(
        ScalingPolicy.after_controller_start)
    assert "self.train_run_context = TrainRunContext(" in inspect.getsource(
        DataParallelTrainer.__init__)


def test_rays_config_check_refuses_a_bad_cluster_config() -> None:
    import pytest

    from raytrain.cloud.cluster_configs import validate_with_ray

    good = {"cluster_name": "c", "max_workers": 1,
            "provider": {"type": "local", "head_ip": "127.0.0.1"},
            "auth": {"ssh_user": "root"}}
    with pytest.raises(Exception):
        validate_with_ray({**good, "max_workers": "many"}, fill_defaults=False)


def test_rays_ssh_runner_has_what_the_runpod_runner_builds_on() -> None:
    """raytrain.cloud.runpod_ssh overrides `_get_node_ip` (the address, and the port as an
    ssh option) and the two file copies, and calls `_get_ssh_target` and `_run_helper`."""
    from ray.autoscaler._private.command_runner import SSHCommandRunner, SSHOptions

    for name in ("_get_node_ip", "_get_ssh_target", "_run_helper", "run_rsync_up",
                 "run_rsync_down", "remote_shell_command_str"):
        assert callable(getattr(SSHCommandRunner, name)), name
    # This module checks Ray's private parts raytrain relies on: private access is its point.
    assert list(inspect.signature(SSHCommandRunner._run_helper).parameters)[:2] == [  # noqa: SLF001
        "self", "final_cmd"]
    options = SSHOptions("key")
    options.arg_dict["Port"] = 2222
    assert ["-o", "Port=2222"] == options.to_ssh_options_list()[-4:-2]


def test_rays_dashboard_probes_no_cloud_with_an_empty_cluster_config_in_its_home(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What raytrain/serve/adaptors/ray_probe.py relies on: the dashboard process is started by
    `ray._private.services.start_api_server`, looked up when called; its usage module reads
    `~/ray_bootstrap_config.yaml` and probes the cloud only when that file is missing, and
    sends its report where RAY_USAGE_STATS_REPORT_URL says."""
    import ray._common.usage.usage_lib as usage_lib
    import ray._private.node
    from ray._private import services
    from ray.dashboard.modules.usage_stats.usage_stats_head import UsageStatsHead

    from raytrain.serve.adaptors.ray_probe import NOWHERE, dashboard_home, install_no_cloud_probe

    assert "ray._private.services.start_api_server(" in inspect.getsource(
        ray._private.node)  # noqa: SLF001
    assert '"~/ray_bootstrap_config.yaml"' in inspect.getsource(UsageStatsHead.run)
    probed: list[str] = []
    monkeypatch.setattr(usage_lib, "get_cloud_from_metadata_requests",
                        lambda: probed.append("probe") or "unknown")
    home = dashboard_home(tmp_path)
    usage_lib.get_cluster_config_to_report(str(home / "ray_bootstrap_config.yaml"))
    assert probed == []
    usage_lib.get_cluster_config_to_report(str(tmp_path / "absent.yaml"))
    assert probed == ["probe"]
    monkeypatch.setenv("RAY_USAGE_STATS_REPORT_URL", NOWHERE)
    assert usage_lib._usage_stats_report_url() == NOWHERE  # noqa: SLF001
    # The wrapper gives the dashboard's start that environment, and only it.
    seen: dict[str, str | None] = {}
    monkeypatch.setattr(services, "start_api_server",
                        lambda *a, **k: seen.update(home=os.environ.get("HOME")))
    install_no_cloud_probe(tmp_path)
    install_no_cloud_probe(tmp_path)  # twice: one wrapper, not two
    services.start_api_server()
    assert seen == {"home": str(home)} and os.environ.get("HOME") != str(home)
    assert services.start_api_server.__wrapped__.__name__ == "<lambda>"


def test_rays_one_machine_mode_takes_the_loopback_without_asking_8_8_8_8(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What raytrain/serve/deploy.py's one_machine relies on: the flag Ray's processes read
    from RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER at import, and that Ray's node address lookup
    consults it when called (false: the loopback, without the UDP socket towards 8.8.8.8)."""
    from ray._private import ray_constants, services, worker

    from raytrain.serve.deploy import ONE_MACHINE, one_machine

    assert ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR == ONE_MACHINE
    assert "ray_constants.ENABLE_RAY_CLUSTER" in inspect.getsource(services.get_node_ip_address)
    monkeypatch.delenv(ONE_MACHINE, raising=False)
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    monkeypatch.setattr(worker, "_global_node", None)  # as in a process not connected yet
    with one_machine():
        assert os.environ[ONE_MACHINE] == "0"
        assert services.get_node_ip_address() == "127.0.0.1"
    assert ONE_MACHINE not in os.environ and ray_constants.ENABLE_RAY_CLUSTER is True
