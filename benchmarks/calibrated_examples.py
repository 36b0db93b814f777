"""`raytrain calibrate`'s profile against the shipped examples, in one service session and
minutes apart, so both see the host at the same speed: each round trains the three reference
jobs, solves the profile from them (raytrain.core.calibration), then trains the shipped
examples and compares each one's measured step with the prediction under that profile.

This machine's speed drifts by up to 2x within minutes (BENCHMARKS.md, "raytrain
calibrate"); a calibration stored and used later carries the speed of its moment. Here the
gap between calibration and use is the length of one round.

    python -m benchmarks.calibrated_examples [--rounds N] [--steps N]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.local_service import start, stop
from raytrain import Client, load_job_spec
from raytrain.catalog.hardware import CATALOG
from raytrain.core.calibration import reference_jobs, solve_profile, steady_step_s
from raytrain.core.resolve import job_layout, predicted
from raytrain.spec import JobSpec, parse_job_spec

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ("examples/demo.yaml", "examples/job.json", "examples/hybrid.yaml")


def median_step(client: Client, spec: JobSpec) -> float:
    """A job's step time as `raytrain calibrate` reads it (steady_step_s)."""
    status = client.submit(spec).wait()
    assert status.state.value == "SUCCEEDED", status.error
    step_s = steady_step_s([e.data for e in client.events(status.id) if e.type == "progress"])
    client.delete(status.id)
    assert step_s is not None, f"{spec.name} sent fewer than two progress reports"
    return step_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300, help="of each tiny reference job")
    args = parser.parse_args()
    references = [parse_job_spec(job) for job in reference_jobs(args.steps)]
    url, token, _ = start(prefix="raytrain-calex-")
    client = Client(url, token=token)
    rows = []
    try:
        for number in range(1, args.rounds + 1):
            profile = solve_profile([(spec, median_step(client, spec)) for spec in references])
            hardware = CATALOG.with_cpu_profile(profile.figures,
                                                f"round {number} of this benchmark")
            figures = profile.figures
            print(f"round {number}: {figures['fp32_flops'] / 1e9:.1f} GFLOP/s, "
                  f"{figures['block_overhead_s'] * 1e3:.2f} ms per block, "
                  f"{figures['step_overhead_s'] * 1e3:.2f} ms per step", flush=True)
            for example in EXAMPLES:
                spec = load_job_spec(ROOT / example)
                expected = predicted(spec, job_layout(spec), hardware).step_s
                measured = median_step(client, spec)
                rows.append((number, example, expected, measured))
                print(f"  {example}: predicted {expected:.4f} s, measured {measured:.4f} s, "
                      f"{measured / expected:.2f}x", flush=True)
    finally:
        stop()
    print("\n| round | example | predicted s/step | measured s/step | measured/predicted |")
    print("|---|---|---|---|---|")
    for number, example, expected, measured in rows:
        print(f"| {number} | {example} | {expected:.4f} | {measured:.4f} | "
              f"{measured / expected:.2f} |")


if __name__ == "__main__":
    main()
