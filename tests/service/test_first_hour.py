"""What a new user hit in their first hour, each checked with plain values and processes:
errors that survive the trip between processes, flags checked like a job spec, offers that
match the job's devices, no metadata address on a local run, worker output kept by rank."""

from __future__ import annotations

import inspect
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import raytrain.errors as errors
from raytrain.cli import main
from raytrain.cli.views import duration_text, usd_text
from raytrain.cloud.interruption import watch_endpoint
from raytrain.core.offers_answer import offers_response
from raytrain.errors import FieldError, SpecError
from raytrain.spec import load_job_spec, parse_job_spec
from raytrain.spec.files import load_policies, snapshot
from raytrain.train.worker_logs import READ_BYTES, captured_output, read_logs

ROOT = Path(__file__).resolve().parents[2]

EXAMPLE_ERRORS = {
    errors.RaytrainError: ("something failed. To fix: retry",),
    errors.SpecError: ([FieldError(("data", "path"), "x is not a readable file. To fix: y")],
                       "job spec"),
    errors.JobNotFoundError: ("ab12",),
    errors.JobStateError: ("job ab12 already ended SUCCEEDED; nothing to cancel",),
    errors.NotAuthorizedError: ("this service needs a token. To fix: set RAYTRAIN_TOKEN",),
    errors.ServiceUnreachableError: ("http://127.0.0.1:9", "connection refused"),
    errors.ServiceError: (503, "the job manager is not answering"),
    errors.TrainingError: ("training failed: NaN loss at step 12",),
    errors.IllegalTransition: ("ab12", "SUCCEEDED", "RUNNING"),
    errors.StoreError: ("s3://bucket/jobs", "upload", "AccessDenied", "grant s3:PutObject"),
    errors.RetryLaterError: ("the job store is read-only. To fix: retry in 5 s", 5),
    errors.ServiceBusyError: ("1000 jobs are queued or running. To fix: retry later", 30),
    errors.ServiceUnavailableError: ("storage s3://b failed. To fix: retry in 5 s", 5),
}


def test_every_error_type_pickles_to_the_same_message_and_fields() -> None:
    types = {obj for _, obj in inspect.getmembers(errors, inspect.isclass)
             if issubclass(obj, errors.RaytrainError)}
    assert types == set(EXAMPLE_ERRORS), "add an example for each new error type"
    for kind, args in EXAMPLE_ERRORS.items():
        error = kind(*args)
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is kind and str(again) == str(error)
        assert vars(again) == vars(error)
    spec_error = pickle.loads(pickle.dumps(EXAMPLE_ERRORS[SpecError] and
                                           SpecError(*EXAMPLE_ERRORS[SpecError])))
    assert spec_error.errors[0].path == "data.path"


def test_a_workers_raytrain_error_reaches_the_status_intact() -> None:
    from ray.exceptions import RayTaskError
    from ray.train import WorkerGroupError

    from raytrain.serve.adaptors.ray_cluster import describe_failure as _describe_failure

    cause = SpecError([FieldError(("data", "path"), "/tmp/t.bin holds 3 tokens, fewer than "
                                  "seq_len + 1 = 33. To fix: lower data.seq_len")])
    crossed = pickle.loads(pickle.dumps(WorkerGroupError("rank 1 failed", {1: cause, 0: cause})))
    wrapped = RayTaskError("run", "Traceback ...", crossed).as_instanceof_cause()
    assert _describe_failure(wrapped) == str(cause)
    assert _describe_failure(RuntimeError("a\nb\nCUDA error: out of memory")).endswith(
        "CUDA error: out of memory")


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raytrain.cli", *argv], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


@pytest.mark.parametrize("argv, flag", [
    (["simulate", "--trace", "/no/such/trace.csv"], "--trace"),
    (["simulate", "--nodes", "0"], "--nodes"),
    (["simulate", "--starts", "0"], "--starts"),
    (["simulate", "--work-hours", "-1"], "--work-hours"),
    (["simulate", "--deadline-hours", "nan"], "--deadline-hours"),
    (["plan", "examples/demo.yaml", "--gpus", "0"], "--gpus"),
    (["plan", "examples/demo.yaml", "--price", "-2"], "--price"),
    (["offers", "--top", "zero"], "--top"),
    (["serve", "--port", "70000"], "--port"),
    (["logs", "abc", "--rank", "-1"], "--rank"),
])
def test_bad_flags_exit_2_naming_the_flag_and_the_fix(argv: list[str], flag: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2


def test_flag_errors_name_the_flag_and_the_fix_on_stderr() -> None:
    done = run_cli("simulate", "--starts", "0")
    assert done.returncode == 2 and "--starts" in done.stderr and "To fix" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_server_flag_works_before_and_after_the_command() -> None:
    for argv in (["--server", "http://127.0.0.1:9", "list"],
                 ["list", "--server", "http://127.0.0.1:9"]):
        done = run_cli(*argv)
        assert done.returncode == 1, done.stderr
        assert "http://127.0.0.1:9" in done.stderr


@given(st.floats(min_value=1e-6, max_value=1e7))
def test_durations_and_dollars_never_print_as_zero_or_exponents(value: float) -> None:
    for text in (duration_text(value), usd_text(value)):
        assert "e-" not in text and "e+" not in text
    assert usd_text(value) != "$0.00"


def test_tiny_figures_read_in_sensible_units() -> None:
    assert duration_text(8.51e-05 * 3600) == "0.31 s"
    assert duration_text(0.033) == "33 ms"
    assert duration_text(5400) == "1.5 h"
    assert usd_text(0.0021) == "$0.0021"


def test_a_cpu_job_is_ranked_only_onto_cpu_offers() -> None:
    catalog, policy = snapshot(), load_policies()["cost-first"]
    demo = load_job_spec(ROOT / "examples" / "demo.yaml")  # gpus_per_worker 0
    response = offers_response(catalog, policy, demo)
    assert response.ranking == []
    assert "CPU" in (response.decision or "") and "To fix" in (response.decision or "")
    gpu_job = parse_job_spec({"training": {"global_batch_size": 32},
                              "resources": {"num_workers": 8, "gpus_per_worker": 1,
                                            "accelerator": "h100-sxm"}})
    kinds = {row.gpu_kind for row in offers_response(catalog, policy, gpu_job).ranking}
    assert kinds == {"h100-sxm"}


def test_a_local_run_watches_no_metadata_address() -> None:
    assert watch_endpoint(None, "local", None) is None
    assert watch_endpoint(None, "on-demand", "aws") is None
    assert watch_endpoint(None, "spot", "local") is None  # a cloud without a metadata service
    assert watch_endpoint(None, "spot", "aws") == "http://169.254.169.254"
    assert watch_endpoint("http://127.0.0.1:8111", "local", None) == "http://127.0.0.1:8111"


def test_fields_that_mean_nothing_for_the_kind_and_huge_strings_are_refused() -> None:
    cases = [
        ({"data": {"kind": "synthetic", "path": "/data/tokens.bin"}}, "data.path"),
        ({"data": {"kind": "token_file", "path": "/t.bin", "factory": "a.b:c"}}, "data.factory"),
        ({"model": {"kind": "gpt", "factory": "mylab.models:build"}}, "model.factory"),
        ({"data": {"kind": "token_file", "path": "x" * 5000}}, "data.path"),
        ({"model": {"kind": "import", "factory": "a" * 300 + ":f"}}, "model.factory"),
    ]
    for document, path in cases:
        with pytest.raises(SpecError) as refused:
            parse_job_spec(document)
        assert path in {e.path for e in refused.value.errors}, document
        assert len(str(refused.value)) < 2000  # the message never quotes a huge input
    parse_job_spec({"data": {"kind": "token_file", "path": "/t.bin", "dtype": "uint32"}})


def test_worker_output_is_kept_by_rank_bounded_and_read_from_offsets(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    with captured_output(logs, rank=1, header="attempt 1", max_bytes=4096):
        print("hello from python")
        os.write(2, b"native stderr line\n")
        for _ in range(20):
            print("x" * 1000)  # past max_bytes: the file rotates
    assert (logs / "rank-1.log.1").is_file()
    kept = sum(p.stat().st_size for p in logs.iterdir())
    assert kept <= 2 * 4096 + READ_BYTES  # bounded, whatever the pipe delivered at once
    with captured_output(logs, rank=1, header="attempt 2", max_bytes=2**20):
        print("second attempt")
    [chunk] = read_logs(logs)
    assert chunk.rank == 1 and "second attempt" in chunk.text
    with captured_output(logs, rank=1, header="attempt 3", max_bytes=2**20):
        print("third attempt")
    [more] = read_logs(logs, offsets={1: chunk.offset})
    assert "third attempt" in more.text and "second attempt" not in more.text
    assert read_logs(logs, rank=0) == []
    [tail] = read_logs(logs, offsets={1: 0}, max_bytes=10)  # too far behind: the tail
    assert len(tail.text) <= 10 and tail.skipped > 0


def test_an_error_keeps_its_path_and_command_on_one_line(tmp_path: Path) -> None:
    """stderr is not a terminal here: an error is not broken at 80 columns, so the path and
    the command in it can be copied or grepped whole."""
    state = tmp_path / ("a-long-directory-name-" * 4) / "state"
    stopped = run_cli("stop", f"--state-dir={state}")
    assert stopped.returncode == 1
    [line] = stopped.stderr.strip().splitlines()
    assert f"{state / 'service.json'}" in line and "`raytrain serve --detach`" in line


def test_a_misspelt_field_gets_the_fix_and_the_name_meant_from_the_cli_and_the_api(
        tmp_path: Path) -> None:
    """The CLI (a subprocess) says what the service says: the fix, and the field probably
    meant, at any depth of the spec."""
    from tests.support.service import Service, small_job

    typo = tmp_path / "typo.yaml"
    typo.write_text("name: t\ntraining: {steps: 3, learning_rat: 0.1}\n"
                    "model: {gpt: {num_layer: 2}}\n")
    refused = run_cli("submit", str(typo))
    assert refused.returncode == 2
    assert "training.learning_rat: Extra inputs are not permitted. To fix: remove it, or did " \
        "you mean learning_rate?" in refused.stderr
    assert "model.gpt.num_layer" in refused.stderr and "num_layers?" in refused.stderr
    document = small_job()
    document["training"]["learning_rat"] = 0.1
    document["resourcez"] = {}
    answer = Service(tmp_path / "state").request("POST", "/v1/jobs", json=document)
    messages = {tuple(e["loc"]): e["msg"] for e in answer.json()["detail"]}
    assert messages[("body", "training", "learning_rat")].endswith(
        "To fix: remove it, or did you mean learning_rate?")
    assert messages[("body", "resourcez")].endswith("did you mean resources?")


def test_plan_says_whose_cpu_figures_it_used_and_finds_them_through_the_state_dir(
        tmp_path: Path) -> None:
    """`raytrain plan --gpu cpu` (a subprocess) reads the profile `raytrain calibrate` stored
    in $RAYTRAIN_STATE_DIR, and says which figures it planned with; without one, it says so
    and suggests calibrating."""
    from raytrain.spec.files import PROFILE_FILE

    demo = str(Path(__file__).resolve().parents[2] / "examples" / "demo.yaml")
    (tmp_path / PROFILE_FILE).write_text(json.dumps({"figures": {"fp32_flops": 3e10}}))
    for state_dir, said in ((tmp_path, "calibrate on this machine"),
                            (tmp_path / "empty", "the catalog's generic figures")):
        planned = subprocess.run(
            [sys.executable, "-m", "raytrain.cli", "plan", demo, "--gpu", "cpu", "--gpus", "2"],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "RAYTRAIN_STATE_DIR": str(state_dir)})
        assert planned.returncode == 0, planned.stderr
        assert said in " ".join(planned.stderr.split()), planned.stderr
    assert "raytrain calibrate" in planned.stderr


def test_the_readmes_plan_and_offers_examples_run_as_written() -> None:
    """Each `raytrain plan` / `raytrain offers` line of the README and the docs that names a
    shipped file runs from the repository's root as written (subprocesses), and the offers
    one ranks."""
    root = Path(__file__).resolve().parents[2]
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    lines = [line.split("#")[0].split() for page in pages for line in
             page.read_text().splitlines()
             if line.strip().startswith(("raytrain plan examples/", "raytrain offers examples/",
                                         "raytrain plan --model-config examples/"))]
    assert len(lines) >= 6
    for argv in lines:
        ran = subprocess.run([sys.executable, "-m", "raytrain.cli", *argv[1:]], cwd=root,
                             capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0, (argv, ran.stderr[-1500:])
        if argv[1] == "offers":
            assert "decision:" in ran.stdout and "no offer" not in ran.stdout, ran.stdout


def test_a_trace_of_other_gpus_is_said_to_be_priced_as_the_instance() -> None:
    """`simulate --trace` with an A100 trace prices it as --instance (p3.2xlarge): said, with
    the fix; a trace of the instance's own kind, or a name that says nothing, is quiet."""
    from raytrain.cli.offline_commands import priced_as_another_kind
    from raytrain.spec.files import snapshot

    offers = snapshot().offers
    p3 = next(o for o in offers if o.instance_type == "p3.2xlarge")
    said = priced_as_another_kind("a100x1-east1b.txt", p3, offers)
    assert said is not None and "priced as p3.2xlarge" in said and "To fix" in said
    g4dn = priced_as_another_kind("g4dn-trace.csv", p3, offers)
    assert g4dn is not None and "--instance g4dn.xlarge" in g4dn
    assert priced_as_another_kind("p3-trace.csv", p3, offers) is None
    assert priced_as_another_kind("v100x1-east1c.txt", p3, offers) is None
    assert priced_as_another_kind("my-fleet.csv", p3, offers) is None


def test_a_checkpoint_path_is_never_cut_on_an_80_column_terminal() -> None:
    """`raytrain status`'s table on an 80-column terminal folds a long checkpoint path: it is
    never cut with an ellipsis (cmd_status then prints it once more whole, on one line)."""
    import io

    from rich.console import Console

    from raytrain.cli.views import status_table
    from raytrain.spec import JobStatus
    from tests.support.service import small_job

    path = "s3://bucket/" + "a-long-prefix-" * 8 + "job/checkpoints/step_000000150"
    job = JobStatus.model_validate({"id": "j", "state": "SUCCEEDED", "spec": small_job(),
                                    "created_at": 0.0,
                                    "checkpoint": {"step": 150, "path": path}})
    drawn = io.StringIO()
    Console(file=drawn, width=80).print(status_table(job))
    assert "…" not in drawn.getvalue() and "..." not in drawn.getvalue()
    folded = "".join(line.strip().removeprefix("checkpoint").strip()
                     for line in drawn.getvalue().splitlines())
    assert path in folded


def test_status_shows_an_elastic_jobs_groups_and_how_many_trained_its_latest_step() -> None:
    import io

    from rich.console import Console

    from raytrain.cli.views import status_table
    from raytrain.spec import JobStatus
    from tests.support.service import small_job

    job = JobStatus.model_validate({
        "id": "j", "state": "RUNNING", "spec": small_job(), "created_at": 0.0,
        "progress": {"step": 40, "total_steps": 100, "groups": 1},
        "groups": [{"index": 0, "state": "training", "nodes": ["n1"], "since": 0.0},
                   {"index": 1, "state": "gone", "since": 0.0}]})
    drawn = io.StringIO()
    Console(file=drawn, width=200).print(status_table(job))
    assert "0 training, 1 gone; 1 in the latest step" in drawn.getvalue()


def test_the_cli_says_first_that_a_job_from_a_file_can_never_start_there(tmp_path: Path) -> None:
    """100,000 workers with a batch that does not divide among them, from a file, against a
    64-CPU service: the CLI shows the service's answer, the capacity refusal first, not the
    batch-size fix the file alone would give (which would lead to it next). Without a service
    to ask, the file's own errors."""
    import yaml

    from raytrain.testing.http_service import served
    from tests.support.service import small_job

    huge = tmp_path / "huge.yaml"
    huge.write_text(yaml.safe_dump(small_job(num_workers=100_000)))
    with served(tmp_path / "state") as (url, token):
        answer = run_cli("--server", url, "--token", token, "submit", str(huge))
    assert answer.returncode == 2, answer.stderr
    assert "can never start here" in answer.stderr and "global_batch_size" in answer.stderr
    assert answer.stderr.index("can never start here") < answer.stderr.index("global_batch_size")
    alone = run_cli("--server", "http://127.0.0.1:9", "submit", str(huge))
    assert alone.returncode == 2 and "global_batch_size" in alone.stderr
    assert "can never start" not in alone.stderr


def test_plan_prices_an_example_whose_model_is_in_a_bucket_from_its_config(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The shipped LoRA example names its model in a bucket this machine does not read:
    `raytrain plan FILE --model-config config.json` plans it from the folder's config (it
    failed on the bucket first), and without --model-config the refusal names that flag."""
    from raytrain.cli import main

    root = Path(__file__).resolve().parents[2]
    example = str(root / "examples" / "hf-lora.yaml")
    assert main(["plan", example, "--model-config",
                 str(root / "examples" / "llama-3-8b-config.json")]) == 0
    assert "best:" in capsys.readouterr().out
    assert main(["plan", example]) == 2
    assert "--model-config CONFIG.json" in capsys.readouterr().err
