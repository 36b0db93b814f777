"""The dashboard in a real browser (Debian's Chromium, headless, driven by Playwright) against
the real service on 127.0.0.1: sign in, submit the demo through the page, watch it train, see
it succeed with its cost, open the offers, see a bad spec's field error, cancel a running job
(whose workers then exit and free their CPUs). The job cancelled is a pipeline x tensor
parallel one on four workers: it also proves that layout trains and checkpoints through the
API on Ray Train.

One test covers the whole flow: each Ray Train fit costs tens of seconds here, so the demo and
the job to cancel train side by side (half and a quarter of a CPU per worker) rather than one
after the other.
Set RAYTRAIN_SCREENSHOTS=docs to write the README's screenshots of the job page.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import NUM_CPUS, Service, train_worker_pids, wait_for
from tests.integration.test_service import cpus_free

playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect
# Each check waits for what the page fetches: seconds on a busy 2-core machine, not 5.
expect.set_options(timeout=30_000)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# As the machine's browser checks: no background connections, no sandbox as root.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
TRAINING_S = 300_000  # ms: generous, a busy 2-core machine trains the demo in about a minute
EXPECTED_NETWORK_ERROR = re.compile(r"status of 422")  # the bad spec, refused on purpose
# Pipeline x tensor parallel on four workers at a quarter CPU each: it trains beside the demo.
HYBRID = """name: hybrid
model: {gpt: {vocab_size: 128, dim: 64, num_layers: 2, num_heads: 4, max_seq_len: 32}}
data: {seq_len: 32}
training: {steps: 100000, global_batch_size: 16, micro_batch_size: 4,
           checkpoint_every_steps: 10, learning_rate: 0.01}
parallel: {strategy: hybrid, pp: 2, tp: 2}
resources: {num_workers: 4, cpus_per_worker: 0.25}
"""
TO_RANK = """name: on-h100
model: {kind: gpt, gpt: {dim: 512, num_layers: 8, num_heads: 8, max_seq_len: 512}}
data: {kind: synthetic, seq_len: 512}
training: {steps: 20000, global_batch_size: 64, micro_batch_size: 8}
resources: {num_workers: 8, accelerator: h100-sxm, gpus_per_worker: 1}
"""


def side_by_side(spec_text: str) -> str:
    """The spec with half a CPU per worker: two jobs share the two CPUs."""
    return spec_text.replace("cpus_per_worker: 1", "cpus_per_worker: 0.5")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: apt-get install chromium")
def test_the_dashboard_follows_a_job_from_submit_to_the_end(
        service: Service, tmp_path: Path) -> None:
    shots = Path(os.environ.get("RAYTRAIN_SCREENSHOTS") or tmp_path)
    demo = (ROOT / "raytrain" / "examples" / "demo.yaml").read_text()
    problems: list[str] = []
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("pageerror", lambda error: problems.append(f"uncaught: {error}"))
        page.on("console", lambda m: problems.append(f"console.{m.type}: {m.text}")
                if m.type == "error" and not EXPECTED_NETWORK_ERROR.search(m.text) else None)

        # Sign in: the page asks for the token before it reads anything.
        page.goto(f"{service.url}/")
        page.fill("#token", "not-a-token")
        page.press("#token", "Enter")
        expect(page.locator("#signin-problem")).to_contain_text("does not know that token")
        problems.clear()  # the refused token's 401 is what that check was for
        page.fill("#token", service.token or "")
        page.press("#token", "Enter")
        expect(page.locator("h1")).to_have_text("Jobs")

        # Submit the job to cancel (pipeline x tensor parallel, on four workers), then the
        # demo; both through the page.
        page.click("a[data-nav=submit]")
        page.fill("#spec", HYBRID)
        page.click("#submit")
        expect(page.locator("#job-state")).to_be_visible()
        long_run = page.url.rsplit("/", 1)[-1]
        page.click("a[data-nav=submit]")
        page.fill("#spec", side_by_side(demo))
        page.click("#submit")
        expect(page.locator("#job-header h1")).to_have_text("demo")

        # The loss chart gains points while the demo trains.
        loss = page.locator("#chart-loss")
        expect(loss).to_have_attribute("data-points", re.compile(r"^([5-9]|\d\d+)$"),
                                       timeout=TRAINING_S)
        expect(page.locator("#job-state")).to_have_text(re.compile("RUNNING|RECOVERING"))
        seen = int(loss.get_attribute("data-points") or 0)
        page.screenshot(path=str(shots / "dashboard-running.png"), full_page=True)
        expect(loss).not_to_have_attribute("data-points", str(seen), timeout=TRAINING_S)
        demo_page = page.url

        # While it trains: the offers, and the policy's ranking for a pasted spec.
        page.click("a[data-nav=offers]")
        expect(page.locator("#offers tbody tr").first).to_be_visible()
        page.fill("#offers-spec", TO_RANK)
        page.click("#rank")
        expect(page.locator("#ranking-table tbody tr").first).to_contain_text("h100")
        expect(page.locator("#decision")).to_contain_text("$")

        # A bad spec: the field's error under the line that sets it; nothing is queued.
        page.click("a[data-nav=submit]")
        page.fill("#spec", demo.replace("steps: 150", "steps: -5"))
        page.click("#submit")
        error = page.locator(".field-error[data-field='training.steps']")
        expect(error).to_contain_text("To fix")
        assert page.url.endswith("#/submit")

        # Back on the demo's page (drawn again from the service's history): it ends
        # SUCCEEDED with its cost shown, every step on the chart.
        page.goto(demo_page)
        expect(page.locator("#job-state")).to_have_text("SUCCEEDED", timeout=TRAINING_S)
        expect(page.locator("#stat-step")).to_have_text("150 / 150")
        expect(page.locator("#stat-cost")).to_have_text(re.compile(r"^\$\d"))
        expect(loss).to_have_attribute("data-points", re.compile(r"^\d{2,3}$"))
        expect(page.locator("#checkpoint-step")).to_have_text("step 150")
        page.screenshot(path=str(shots / "dashboard-finished.png"), full_page=True)
        check_the_axes_read_true(page)
        # A reload draws the whole run again, from the service's history.
        page.reload()
        expect(page.locator("#job-state")).to_have_text("SUCCEEDED")
        expect(loss).to_have_attribute("data-points", re.compile(r"^\d{2,3}$"))

        # The hybrid job trains its planned layout and checkpoints it (DCP, sharded by
        # stage and tensor); then it is cancelled from its page, through the confirmation.
        page.goto(f"{service.url}/#/jobs/{long_run}")
        expect(page.locator("#job-plan")).to_contain_text("tp2 pp2 1f1b")
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
        expect(page.locator("#job-state")).to_have_text("CANCELLED", timeout=120_000)

        # The list shows both, sortable by the keyboard.
        page.click("a[data-nav=jobs]")
        expect(page.locator("#jobs tbody tr[data-job]")).not_to_have_count(0)
        page.locator("#jobs th button", has_text="Spent").focus()
        page.keyboard.press("Enter")
        expect(page.locator("#jobs th[aria-sort=ascending]")).to_have_text(re.compile("Spent"))
        browser.close()
    assert not problems, problems
    # The cancel stopped the workers and freed their CPUs; a second cancel changes nothing.
    wait_for(lambda: not train_worker_pids(), 60, "the training workers to exit")
    wait_for(lambda: cpus_free() >= NUM_CPUS, 60, "the CPUs to be free again")
    again = service.http.delete(f"{service.url}/v1/jobs/{long_run}")
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
