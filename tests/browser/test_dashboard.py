"""The dashboard in a real browser (Debian's Chromium, headless, driven by Playwright) against
the service's HTTP app on 127.0.0.1: sign in, submit the demo through the page, watch it
train, see it succeed with its cost, open the offers, see a bad spec's field error, cancel a
running job, sort the list by the keyboard, and read the charts' axis labels back.

The page only speaks HTTP, so the app serves here over the real job manager, scheduler and
training loop, each run training in a thread of this process (tests/fake_ray.TrainingRay):
a Ray Train start would cost tens of seconds per job and prove nothing more about the page.
The demo's training on Ray Train through the same API is tests/service/ray/test_service.py's.
Set RAYTRAIN_SCREENSHOTS=docs to write the README's screenshots of the job page.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from raytrain.testing.fake_ray import TrainingRay
from raytrain.testing.http_service import served_training

playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect
# Each check waits for what the page fetches: seconds on a busy 2-core machine, not 5.
expect.set_options(timeout=30_000)

pytestmark = [pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# As the machine's browser checks: no background connections, no sandbox as root.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
TRAINING_S = 120_000  # ms: generous, a busy 2-core machine trains the demo in seconds here
EXPECTED_NETWORK_ERROR = re.compile(r"status of 422")  # the bad spec, refused on purpose
HOLD_AT = 60  # the demo waits at this step until the page has seen it running
LONG_RUN = """name: long-run
model: {gpt: {vocab_size: 128, dim: 32, num_layers: 2, num_heads: 4, max_seq_len: 16}}
data: {seq_len: 16}
training: {steps: 1000000, global_batch_size: 8, micro_batch_size: 4,
           checkpoint_every_steps: 10, learning_rate: 0.01}
resources: {num_workers: 1, cpus_per_worker: 1}
"""
TO_RANK = """name: on-h100
model: {kind: gpt, gpt: {dim: 512, num_layers: 8, num_heads: 8, max_seq_len: 512}}
data: {kind: synthetic, seq_len: 512}
training: {steps: 20000, global_batch_size: 64, micro_batch_size: 8}
resources: {num_workers: 8, accelerator: h100-sxm, gpus_per_worker: 1}
"""


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[str, str, TrainingRay]]:
    """The app `raytrain serve` deploys, on 127.0.0.1, over the real job manager and
    scheduler; each run trains in a thread here. (Its URL, the operator token, the cluster.)"""
    cluster = TrainingRay(cpus=2, hold_at=HOLD_AT)
    with served_training(tmp_path / "state", cluster, scheduler_interval_s=0.1) as (url, token):
        yield url, token, cluster
    assert not cluster.errors, cluster.errors


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: apt-get install chromium")
def test_the_dashboard_follows_a_job_from_submit_to_the_end(
        service: tuple[str, str, TrainingRay], tmp_path: Path) -> None:
    url, token, cluster = service
    shots = Path(os.environ.get("RAYTRAIN_SCREENSHOTS") or tmp_path)
    # The demo as shipped, on one worker: each run here trains as one rank.
    # With a validation loss every 25 steps, drawn on the loss chart.
    demo = (ROOT / "raytrain" / "examples" / "demo.yaml").read_text().replace(
        "num_workers: 2", "num_workers: 1").replace(
        "  seed: 0\n", "  seed: 0\n  validation: {fraction: 0.1}\n").replace(
        "  checkpoint_every_steps: 50\n",
        "  checkpoint_every_steps: 50\n  eval_every_steps: 25\n  eval_batches: 1\n")
    assert "validation" in demo and "eval_every_steps" in demo
    # Tracked: TensorBoard's run is a folder in the job's storage; MLflow's server does not
    # answer (nothing listens on port 9), so the page warns while the job trains on.
    demo += ("tracking:\n  tensorboard: {}\n"
             "  mlflow: {tracking_uri: 'http://127.0.0.1:9', experiment: demo}\n")
    problems: list[str] = []
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("pageerror", lambda error: problems.append(f"uncaught: {error}"))
        page.on("console", lambda m: problems.append(f"console.{m.type}: {m.text}")
                if m.type == "error" and not EXPECTED_NETWORK_ERROR.search(m.text) else None)

        # Sign in: the page asks for the token before it reads anything.
        page.goto(f"{url}/")
        page.fill("#token", "not-a-token")
        page.press("#token", "Enter")
        expect(page.locator("#signin-problem")).to_contain_text("does not know that token")
        problems.clear()  # the refused token's 401 is what that check was for
        page.fill("#token", token)
        page.press("#token", "Enter")
        expect(page.locator("h1")).to_have_text("Jobs")

        # Submit the demo through the page; it trains, and waits at HOLD_AT for the page.
        page.click("a[data-nav=submit]")
        page.fill("#spec", demo)
        page.click("#submit")
        expect(page.locator("#job-header h1")).to_have_text("demo")
        demo_page = page.url
        deadline = time.monotonic() + TRAINING_S / 1000
        while not cluster.held.wait(0.5):
            assert not cluster.errors and time.monotonic() < deadline, cluster.errors

        # The loss chart has points while the demo trains.
        loss = page.locator("#chart-loss")
        expect(loss).to_have_attribute("data-points", re.compile(r"^([5-9]|\d\d+)$"))
        expect(page.locator("#job-state")).to_have_text(re.compile("RUNNING|RECOVERING"))
        page.screenshot(path=str(shots / "dashboard-running.png"), full_page=True)
        seen = int(loss.get_attribute("data-points") or 0)

        # While it waits: the offers, and the policy's ranking for a pasted spec.
        page.click("a[data-nav=offers]")
        expect(page.locator("#offers tbody tr").first).to_be_visible()
        page.fill("#offers-spec", TO_RANK)
        page.click("#rank")
        # The cheapest 8 x H100 this service buys: AWS's p5 spot (RunPod's interruptible H100
        # pod is bought only by a service with pod types).
        expect(page.locator("#ranking-table tbody tr").first).to_contain_text("p5.48xlarge")
        expect(page.locator("#decision")).to_contain_text("$")

        # A bad spec: the field's error under the line that sets it; nothing is queued.
        page.click("a[data-nav=submit]")
        page.fill("#spec", demo.replace("steps: 150", "steps: -5"))
        page.click("#submit")
        error = page.locator(".field-error[data-field='training.steps']")
        expect(error).to_contain_text("To fix")
        assert page.url.endswith("#/submit")

        # Back on the demo's page (drawn again from the service's history), the demo goes
        # on: the chart gains points, and it ends SUCCEEDED with its cost, every step drawn.
        page.goto(demo_page)
        expect(loss).to_have_attribute("data-points", str(seen))
        cluster.go.set()
        expect(loss).not_to_have_attribute("data-points", str(seen))
        expect(page.locator("#job-state")).to_have_text("SUCCEEDED", timeout=TRAINING_S)
        expect(page.locator("#stat-step")).to_have_text("150 / 150")
        expect(page.locator("#stat-cost")).to_have_text(re.compile(r"^\$\d"))
        expect(loss).to_have_attribute("data-points", re.compile(r"^\d{2,3}$"))
        expect(loss).to_have_attribute("data-val-points", re.compile(r"^[2-6]$"))
        expect(page.locator("#stat-val-loss")).to_contain_text("perplexity")
        expect(page.locator("#checkpoint-step")).to_have_text("step 150")
        plan = page.locator("#job-plan")
        expect(plan.locator("dt", has_text="tensorboard run")).to_be_visible()
        expect(plan.locator(".tracked-run").first).to_contain_text("tensorboard")
        expect(plan.locator("dd.warn")).to_contain_text("mlflow:")
        page.screenshot(path=str(shots / "dashboard-finished.png"), full_page=True)
        check_the_axes_read_true(page)
        # A reload draws the whole run again, from the service's history.
        page.reload()
        expect(page.locator("#job-state")).to_have_text("SUCCEEDED")
        expect(loss).to_have_attribute("data-points", re.compile(r"^\d{2,3}$"))

        # A long job, submitted through the page, trains and checkpoints; then it is
        # cancelled from its page, through the confirmation.
        page.click("a[data-nav=submit]")
        page.fill("#spec", LONG_RUN)
        page.click("#submit")
        expect(page.locator("#job-header h1")).to_have_text("long-run")
        long_run = page.url.rsplit("/", 1)[-1]
        expect(page.locator("#job-plan")).to_contain_text("1 device mb4x2")
        expect(page.locator("#chart-loss")).to_have_attribute(
            "data-points", re.compile(r"^[1-9]"), timeout=TRAINING_S)
        expect(page.locator("#checkpoint-step")).to_have_text(re.compile(r"^step [1-9]"),
                                                              timeout=TRAINING_S)
        page.click("#cancel")
        expect(page.locator("#confirm")).to_be_visible()
        page.keyboard.press("Escape")  # keyboard: Escape keeps it running
        expect(page.locator("#job-state")).to_have_text(re.compile("RUNNING|RECOVERING"))
        page.click("#cancel")
        page.click("#confirm-yes")
        expect(page.locator("#job-state")).to_have_text("CANCELLED", timeout=60_000)

        # The list shows both, sortable by the keyboard.
        page.click("a[data-nav=jobs]")
        expect(page.locator("#jobs tbody tr[data-job]")).to_have_count(2)
        page.locator("#jobs th button", has_text="Spent").focus()
        page.keyboard.press("Enter")
        expect(page.locator("#jobs th[aria-sort=ascending]")).to_have_text(re.compile("Spent"))
        browser.close()
    assert not problems, problems
    # The cancel stopped the run (its thread here; its workers on Ray); a second cancel
    # changes nothing.
    deadline = time.monotonic() + 60
    while any(t.name.startswith(f"run-{long_run}-") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the cancelled run trains on"
        time.sleep(0.1)
    again = httpx.delete(f"{url}/v1/jobs/{long_run}", timeout=30,
                         headers={"Authorization": f"Bearer {token}"})
    assert again.status_code == 409 and "already ended CANCELLED" in again.text


def _tick_value(label: str) -> float:
    """A drawn tick label as a number: '12K' 12000, '1.5M' 1.5e6, '$0.004/h' 0.004."""
    text = label.replace(",", "").replace("$", "").removesuffix("/h").strip()
    scale = {"K": 1e3, "M": 1e6, "B": 1e9}.get(text[-1:].upper(), 1.0)
    return float(text[:-1] if scale != 1.0 else text) * scale


def check_the_axes_read_true(page: Any) -> None:
    """The labels uPlot drew on each axis (read back from the page) read as the data does:
    the tokens/s axis spans the throughput drawn, with every digit; the dollar axes never
    repeat a label; the time axis reads whole clock seconds."""
    read = "(id) => { const p = document.querySelector(id).plot; " \
        "return {axes: p.axes.map((a) => a._values || []), data: p.data}; }"
    speed = page.evaluate(read, "#chart-speed")
    drawn = [v for v in speed["data"][1] if v is not None]
    ticks = [_tick_value(label) for label in speed["axes"][1] if label]
    assert drawn and ticks, speed["axes"]
    assert max(ticks) <= 2 * max(drawn) and max(ticks) >= 0.4 * max(drawn), \
        (speed["axes"][1], max(drawn))
    cost = page.evaluate(read, "#chart-cost")
    for labels in cost["axes"][1:]:
        shown = [label for label in labels if label]
        assert len(set(shown)) == len(shown), labels  # no "$0.00" five times
    for chart in (speed, cost):
        assert all(re.fullmatch(r"\d{2}:\d{2}:\d{2}", label) for label in chart["axes"][0]
                   if label), chart["axes"][0]
