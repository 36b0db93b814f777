"""The long fuzz of the HTTP API: schemathesis' CLI (all its checks, the examples, coverage
and fuzzing phases) against the live OpenAPI document, and the figures: cases generated,
failures, 5xx answers. The suite runs a bounded version (tests/service/test_api_fuzz.py).

    python -m benchmarks.api_fuzz                      # the API on 127.0.0.1, fake cluster
    python -m benchmarks.api_fuzz --examples 100
    RAYTRAIN_TOKEN=... python -m benchmarks.api_fuzz --url http://127.0.0.1:8000  # a service

Without --url it serves the app `raytrain serve` deploys over a job manager on the recording
fake of Ray (raytrain/testing/http_service.py), so the hundreds of jobs the fuzzer submits queue and
never train. Against a real service they would: point it at a cluster that cannot run them.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from raytrain.testing.http_service import served

CONFIG = Path(__file__).parents[1] / "tests" / "service" / "schemathesis.toml"


def fuzz(url: str, token: str, examples: int) -> int:
    st = shutil.which("st", path=str(Path(sys.executable).parent)) or "st"
    command = [st, "--config-file", str(CONFIG), "run", f"{url}/openapi.json",
               "--checks", "all", "--max-examples", str(examples),
               "--phases", "examples,coverage,fuzzing", "--continue-on-failure",
               "-H", f"Authorization: Bearer {token}", "--seed", "1"]
    started = time.monotonic()
    run = subprocess.run(command, env={**os.environ, "RAYTRAIN_TOKEN": token},
                         capture_output=True, text=True)
    seconds = time.monotonic() - started
    print(run.stdout[-6000:])
    generated = re.search(r"(\d+) generated", run.stdout)
    failures = re.search(r"(\d+) unique failure", run.stdout)
    server_errors = len(re.findall(r"^\[5\d\d\]", run.stdout, flags=re.M))
    print(f"cases generated: {generated.group(1) if generated else '?'}, "
          f"unique failures: {failures.group(1) if failures else 0}, 5xx answers shown: "
          f"{server_errors}, in {seconds:.0f} s (exit {run.returncode})")
    return run.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running service (its token in RAYTRAIN_TOKEN)")
    parser.add_argument("--examples", type=int, default=30, help="per operation and phase")
    args = parser.parse_args()
    if args.url:
        code = fuzz(args.url, os.environ["RAYTRAIN_TOKEN"], args.examples)
    else:
        # The fuzzer checks each operation with wrong tokens too, from the one address its
        # valid requests come from: past auth.GUESSES_ALLOWED of them the address would be
        # slowed (429) and the rest of the run would test the pace, not the API (the pace has
        # its own test, tests/service/test_access.py). Against --url, expect that 429.
        from raytrain.serve.http import auth

        auth.GUESSES_ALLOWED = 10**9
        with tempfile.TemporaryDirectory() as tmp, served(Path(tmp)) as (url, token):
            code = fuzz(url, token, args.examples)
    sys.exit(code)


if __name__ == "__main__":
    main()
