"""The getting-started page (docs/index.md), walked as a newcomer walks it: its install lines
are the README's (which .ci/run runs as written), then `raytrain demo`, the page's own job file
through a detached service (submit, follow, list), and the Hugging Face fine-tune (data
prepare on chats, submit, export, `from_pretrained` on the folder), and `raytrain stop`: what
`serve --detach` left running answers on loopback only, and `stop` stops it and nothing else.

Each command is read from the page and run as written, from the folder above a clone; what a
reader would change is changed the same way here: `.venv/bin/` is this interpreter's folder,
the service gets a free port and a state directory of the test's, and the paths the page
names as the reader's own (`/mnt/models/Qwen3-0.6B`, `chats.jsonl`, `my-qwen3.yaml`, `ID`)
are a tiny Qwen3 folder and chats made here, a copy of examples/hf-qwen3.yaml pointed at them
on CPU workers, and the job's id. A command that fails, a page that loses one of these steps,
or a job that does not succeed fails the test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import torch
import yaml

from raytrain.api_tokens import read_tokens
from raytrain.testing.ray_service import free_port
from tests.support.corpus import CHATML, chat_inputs
from tests.support.hf_models import make_folder

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
PAGE = ROOT / "docs" / "index.md"


def _blocks(section: str, language: str) -> list[str]:
    """The page's `language` code blocks under the heading `## section`."""
    text = PAGE.read_text()
    start = text.index(f"## {section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start:end if end > 0 else None]
    return re.findall(rf"```{language}\n(.*?)```", body, re.S)


def _commands(section: str) -> list[list[str]]:
    """Each command line of the section's bash blocks, split as the shell would, its comment
    left out."""
    lines = [line.split("  #")[0].strip() for block in _blocks(section, "bash")
             for line in block.splitlines()]
    return [line.split() for line in lines if line and not line.startswith("#")]


def _run(argv: list[str], here: Path, env: dict[str, str], timeout: float
         ) -> subprocess.CompletedProcess[str]:
    assert argv[0] == ".venv/bin/raytrain", argv
    done = subprocess.run([str(BIN / "raytrain"), *argv[1:]], cwd=here, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-3000:])
    return done


def _beside_a_clone(folder: Path) -> Path:
    """A folder as a user stands in: the parent of a clone (a `raytrain/` folder that is not
    the installed package) beside a package folder of their own (`mylab/`); importing either
    from there fails loudly."""
    for name in ("raytrain", "mylab"):
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(
            f"raise ImportError('the {name}/ folder in the working directory was imported')\n")
    return folder


def _check_the_detached_service(url: str, state_dir: Path, started: str, env: dict[str, str],
                                here: Path) -> dict[str, Any]:
    """`serve --detach` from beside a clone (whose `raytrain/` folder Ray's workers imported
    instead of the installed package, so the service never deployed) left a service on
    loopback only, with its operator token written owner-only; a second start is refused.
    Answers the service's record."""
    assert "raytrain stop" in started and "tokens.json" in started
    token = read_tokens(state_dir)["operator"]
    assert httpx.get(f"{url}/v1/jobs", timeout=10).status_code == 401
    auth = {"Authorization": f"Bearer {token}"}
    # The job manager imports what is installed: no mylab is, the folder is not it.
    refused = httpx.post(f"{url}/v1/jobs", timeout=30, headers=auth, json={
        "model": {"kind": "import", "factory": "mylab.models:build"},
        "data": {"kind": "import", "factory": "mylab.data:build"}})
    assert refused.status_code == 422, refused.text
    assert "cannot import 'mylab.models'" in refused.text
    assert "folder in the working directory" not in refused.text
    # Ray took the loopback address it was given, not the machine's outward one.
    head_log = re.sub(r"\x1b\[[0-9;]*m", "", (state_dir / "ray-head.log").read_text())
    assert "Local node IP: 127.0.0.1" in head_log
    record: dict[str, Any] = json.loads((state_dir / "service.json").read_text())
    assert psutil.pid_exists(record["head_pid"])
    # Ray's session folder (its logs) is reached from the state dir, not /tmp/ray: a pytest
    # path is too long for Ray's sockets, so `ray` there links to a short folder.
    session = Path(record["temp_dir"])
    assert session.name.startswith("session_2") and (session / "logs").is_dir()
    assert session.parent == (state_dir / "ray").resolve()
    again = subprocess.run(
        [str(BIN / "raytrain"), "serve", "--detach", f"--port={free_port()}",
         f"--state-dir={state_dir}"], env=env, capture_output=True, text=True, timeout=60,
        cwd=here)
    assert again.returncode == 1 and "raytrain stop" in again.stderr
    return record


def _check_all_stopped(url: str, record: dict[str, Any], others: set[int], state_dir: Path,
                       env: dict[str, str]) -> None:
    """`raytrain stop` stopped what serve --detach started and nothing else (the session's
    own Ray cluster, if running, is untouched), its session folder too; a second stop says
    there is nothing to stop."""
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/healthz", timeout=5)
    assert not psutil.pid_exists(record["head_pid"]) or \
        psutil.Process(record["head_pid"]).status() == psutil.STATUS_ZOMBIE
    assert not [p for p in psutil.process_iter(["cmdline"])
                if record["temp_dir"] in " ".join(p.info.get("cmdline") or [])]
    assert not Path(record["temp_dir"]).exists()
    assert others <= _raylets()
    nothing = subprocess.run([str(BIN / "raytrain"), "stop", f"--state-dir={state_dir}"],
                             env=env, capture_output=True, text=True, timeout=60)
    assert nothing.returncode == 1 and "nothing to stop" in nothing.stderr


def _raylets() -> set[int]:
    return {p.pid for p in psutil.process_iter(["cmdline"])
            if "raylet" in " ".join(p.info.get("cmdline") or [])}


def test_the_install_lines_are_the_readmes() -> None:
    """The page's two set-up commands are the README's first code block, which .ci/run runs."""
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"```bash\n(.*?)```", readme, re.S)
    assert first is not None
    commands = [line for line in first.group(1).splitlines()
                if line.strip() and not line.startswith("#")]
    page = [line for line in _blocks("Install and run the demo", "bash")[0].splitlines()
            if line.strip() and not line.startswith("#")]
    assert page == commands and len(commands) == 2
    assert commands[0].endswith("raytrain demo") and commands[1].endswith("pytest")


def test_every_command_of_the_getting_started_page(tmp_path: Path) -> None:
    here = _beside_a_clone(tmp_path / "work")
    # a newcomer's shell: no cluster, service or token of anyone else's (the suite's own
    # service sets them for its tests)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAYTRAIN_TOKEN", "RAYTRAIN_SERVER")}

    # The demo, as the README's first command runs it (its own local Ray, then nothing left).
    [demo, _] = [line for line in _blocks("Install and run the demo", "bash")[0].splitlines()
                 if line and not line.startswith("#")]
    demo_argv = demo.split("&&")[-1].split()
    assert demo_argv == [".venv/bin/raytrain", "demo"]
    started = time.monotonic()
    shown = _run([*demo_argv, f"--port={free_port()}", f"--state-dir={tmp_path / 'demo'}"],
                 here, env, timeout=300)
    assert "demo wall time" in shown.stdout and "SUCCEEDED" in shown.stdout + shown.stderr
    print(f"the demo: {time.monotonic() - started:.1f} s")

    # A job of your own: the page's job file, through a detached service.
    [job_file] = _blocks("A job of your own", "yaml")
    (here / "my-job.yaml").write_text(job_file)
    state_dir, port = tmp_path / "state", free_port()
    env["RAYTRAIN_SERVER"] = f"http://127.0.0.1:{port}"
    commands = _commands("A job of your own")
    assert [c[1] for c in commands] == ["serve", "submit", "list"]
    serve, submit, listing = commands
    others = _raylets()
    started = _run([*serve, f"--port={port}", f"--state-dir={state_dir}", "--allow-import",
                    "mylab"], here, env, timeout=240)
    url = env["RAYTRAIN_SERVER"]
    stopped = False
    try:
        record = _check_the_detached_service(url, state_dir, started.stderr, env, here)
        started = time.monotonic()
        followed = _run(submit, here, env, timeout=300)
        print(f"serve --detach and the job of your own: {time.monotonic() - started:.1f} s")
        assert re.search(r"submitted job \w+", followed.stderr)
        assert "my-first-job" in _run(listing, here, env, timeout=60).stdout

        # A Hugging Face fine-tune on chats: prepare, submit, export, stop.
        prepare, submit_hf, export, stop_line = _commands("Fine-tune a Hugging Face model")
        assert [c[1] for c in (prepare, submit_hf, export, stop_line)] == \
            ["data", "submit", "export", "stop"]
        model = tmp_path / "Qwen3-0.6B"
        make_folder("qwen3", model, vocab_size=320)
        _, [chats] = chat_inputs(model, CHATML)
        shards, exported = tmp_path / "chats-tok", tmp_path / "my-qwen3"
        mine = {"/mnt/models/Qwen3-0.6B": str(model), "chats.jsonl": chats,
                "/mnt/data/chats-tok": str(shards), "/mnt/models/my-qwen3": str(exported)}
        _run([mine.get(a, a) for a in prepare], here, env, timeout=120)
        example = yaml.safe_load((ROOT / "examples" / "hf-qwen3.yaml").read_text())
        example["model"]["hf"]["path"] = str(model)
        example["data"].update(path=str(shards), seq_len=32)
        example["training"].update(steps=4, global_batch_size=4, micro_batch_size=2,
                                   warmup_steps=1, precision="fp32")
        example["resources"] = {"num_workers": 2, "cpus_per_worker": 1}
        (here / "my-qwen3.yaml").write_text(yaml.safe_dump(example))
        trained = _run(submit_hf, here, env, timeout=300)
        found = re.search(r"submitted job (\w+)", trained.stderr)
        assert found is not None, trained.stderr
        mine["ID"] = found.group(1)
        _run([mine.get(a, a) for a in export], here, env, timeout=120)
        import transformers

        loaded = transformers.AutoModelForCausalLM.from_pretrained(exported)
        with torch.no_grad():
            assert torch.isfinite(loaded(torch.tensor([[1, 2, 3]])).logits).all()
        assert stop_line == [".venv/bin/raytrain", "stop"]
        _run([*stop_line, f"--state-dir={state_dir}"], here, env, timeout=180)
        stopped = True
        _check_all_stopped(url, record, others, state_dir, env)
    finally:
        if not stopped:
            subprocess.run([str(BIN / "raytrain"), "stop", f"--state-dir={state_dir}"],
                           cwd=here, env=env, capture_output=True, text=True, timeout=180)
