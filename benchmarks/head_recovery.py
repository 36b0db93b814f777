"""How long a new head node takes to recover N job records from the bucket alone.

    python -m benchmarks.head_recovery [--records 100 1000]

For each N: a job manager (the service's own, over the recording fake of Ray, so no job
trains) with `storage_path` on a local S3 server (moto's server mode on 127.0.0.1, spoken to
through boto3) takes N submits and mirrors them; then its head is lost (its mirror stops, its
lease is not handed back) and a job manager on an empty state directory with the same
storage starts. Printed: the time to mirror the N records, the new head's start (waiting
for the lost head's lease to lapse, `storage_lease_s`, then reading every record) and the
read alone, and how many records came back.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from raytrain.cloud.object_store import open_store
from raytrain.serve.jobs.durable import read_mirror
from raytrain.serve.jobs.manager import JobManager
from raytrain.spec import JobSpec, ServiceConfig
from raytrain.testing.fake_ray import FakeRay
from raytrain.testing.s3_server import make_bucket, s3_server

LEASE_S = 2.0


def job(n: int) -> dict:
    return {"name": f"job-{n}", "model": {"gpt": {"vocab_size": 64, "dim": 32, "num_layers": 2,
                                                  "num_heads": 4, "max_seq_len": 16}},
            "data": {"seq_len": 16},
            "training": {"steps": 100, "global_batch_size": 8, "micro_batch_size": 4},
            "resources": {"num_workers": 1, "cpus_per_worker": 1}}


def recover(endpoint: str, records: int, root: Path) -> str:
    storage = f"s3://jobs/n{records}"
    first = ServiceConfig(state_dir=str(root / "head1"), storage_path=storage,
                          storage_lease_s=LEASE_S, max_active_jobs=100_000)
    manager = JobManager(first.model_dump(mode="json"), cluster=FakeRay(cpus=64),
                         schedule=False).start()
    started = time.monotonic()
    ids = {manager.submit(JobSpec.model_validate(job(n))).id for n in range(records)}
    store = manager._store  # noqa: SLF001 - the benchmark watches the mirror drain
    while store._to_mirror:  # noqa: SLF001 - every record copied to the bucket
        time.sleep(0.05)
    mirrored_s = time.monotonic() - started
    store.stop_mirror()  # the head is lost: no more copies, the lease not handed back

    read_started = time.monotonic()
    loaded, _ = read_mirror(open_store(storage))
    read_s = time.monotonic() - read_started
    second = first.model_copy(update={"state_dir": str(root / "head2")})
    started = time.monotonic()
    again = JobManager(second.model_dump(mode="json"), cluster=FakeRay(cpus=64),
                       schedule=False).start()
    start_s = time.monotonic() - started
    back = set(again.records)
    again.shutdown()
    return (f"| {records} | {mirrored_s:.1f} | {start_s:.2f} | {read_s:.2f} | "
            f"{len(back & ids)}/{records} ({len(loaded)} read alone) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, nargs="+", default=[100, 1000])
    args = parser.parse_args()
    print(f"| records | mirrored in s | new head's start s (lease {LEASE_S:.0f} s to lapse) "
          "| the read alone s | records recovered |")
    print("|---:|---:|---:|---:|---|")
    with s3_server() as endpoint, tempfile.TemporaryDirectory() as root:
        make_bucket(endpoint, "jobs")
        for records in args.records:
            print(recover(endpoint, records, Path(root) / str(records)), flush=True)


if __name__ == "__main__":
    main()
