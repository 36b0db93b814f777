"""Predicted against measured step time of the shipped examples, each run through the
service on this machine's local Ray: what a job's status shows side by side
(plan.predicted_step_s, plan.measured_step_s).

Measured is the median over the job's progress reports after the first of their step time
(the steps since the report before, about a second of training, checkpoint saves left out:
what the status shows as plan.measured_step_s); beside it, the same reports' tokens/s turned
into seconds per step (saves included: what the job's throughput pays).

    python -m benchmarks.predicted_vs_measured [--steps N] [--calibrated STATE_DIR]
        [--example examples/llama-style.yaml]

With --calibrated, the service plans with the CPU profile `raytrain calibrate` stored in
STATE_DIR (e.g. ~/.raytrain) instead of the catalog's.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from benchmarks.local_service import start, stop
from raytrain import Client, load_job_spec
from raytrain.core.calibration import steady_step_s

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ("examples/demo.yaml", "examples/job.json", "examples/hybrid.yaml",
            "examples/llama-style.yaml")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None,
                        help="train each example this many steps (default: its own)")
    parser.add_argument("--calibrated", type=Path, metavar="STATE_DIR",
                        help="plan with the CPU profile `raytrain calibrate` stored there")
    parser.add_argument("--example", action="append", choices=EXAMPLES,
                        help="only this example (repeatable; default: all)")
    args = parser.parse_args()
    url, token, _ = start(prefix="raytrain-pvm-", profile_from=args.calibrated)
    client = Client(url, token=token)
    rows = []
    try:
        for example in args.example or EXAMPLES:
            spec = load_job_spec(ROOT / example)
            if args.steps:
                spec = spec.model_copy(update={"training": spec.training.model_copy(
                    update={"steps": args.steps})})
            status = client.submit(spec).wait()
            assert status.state.value == "SUCCEEDED", status.error
            reports = [e.data for e in client.events(status.id) if e.type == "progress"]
            rates = [r["tokens_per_s"] for r in reports[1:] if r.get("tokens_per_s")]
            rows.append((example, status.plan.description, status.plan.predicted_step_s,
                         steady_step_s(reports),
                         status.plan.tokens_per_step / statistics.median(rates),
                         len(reports) - 1))
    finally:
        stop()
    print("| example | layout | predicted s/step | measured s/step (median) | "
          "measured/predicted | with saves | reports |")
    print("|---|---|---|---|---|---|---|")
    for example, layout, predicted, measured, with_saves, count in rows:
        print(f"| {example} | {layout} | {predicted:.4f} | {measured:.4f} | "
              f"{measured / predicted:.2f} | {with_saves:.4f} | {count} |")


if __name__ == "__main__":
    main()
