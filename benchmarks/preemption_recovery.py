"""What a preemption costs a job here: time from the interruption notice to a durable
checkpoint, from replacement capacity to the first step after resuming, and steps lost, with
a notice and without one, for a job on 2 and on 4 workers.

    python -m benchmarks.preemption_recovery

Runs the real service, Ray's real autoscaler with its fake multi-node provider and a local
instance metadata service (raytrain/testing/fake_cluster.py): 2-slot CPU nodes, the small GPT of the
integration tests, a checkpoint every 50 steps. A notice comes from the metadata service; the
node is then taken through the autoscaler, as a cloud would take it. Without a notice the
node is taken while the job trains.
"""

from __future__ import annotations

import time

from raytrain.client import Client
from raytrain.spec import JobState, PreemptionRecord
from raytrain.testing.fake_cluster import started_fake_cluster
from raytrain.testing.ray_service import job_spec, wait_for


def _running_past(client: Client, job_id: str, steps: int) -> None:
    start = client.get(job_id).progress.step
    wait_for(lambda: (s := client.get(job_id)).state == JobState.RUNNING
             and s.progress.step >= start + steps, 300, "training to go on")


def measure(workers: int) -> list[PreemptionRecord]:
    with started_fake_cluster(max_spot_nodes=workers // 2) as cluster:
        client = Client(cluster.url, token=cluster.token)
        spec = job_spec(steps=100_000, checkpoint_every=50)
        spec["resources"] = {"num_workers": workers, "cpus_per_worker": 1}
        job = client.submit(spec)
        _running_past(client, job.id, 40)
        cluster.metadata.interrupt()
        wait_for(lambda: client.get(job.id).preemption_log, 120, "the notice checkpoint")
        cluster.metadata.clear()
        cluster.take_node(next(iter(cluster.worker_nodes())))
        _running_past(client, job.id, 75)  # past the next periodic checkpoint, mid-interval
        cluster.take_node(next(iter(cluster.worker_nodes())))
        wait_for(lambda: len(log := client.get(job.id).preemption_log) == 2
                 and log[1].after is not None, 300, "resuming after the loss")
        records = client.get(job.id).preemption_log
        client.cancel(job.id)
        return records


def main() -> None:
    print("| workers | preemption | notice to durable checkpoint s | capacity to first step s "
          "| down s | steps lost |")
    print("|---:|---|---:|---:|---:|---:|")
    for workers in (2, 4):
        began = time.perf_counter()
        for record in measure(workers):
            notice = "-" if record.notice_to_checkpoint_s is None \
                else f"{record.notice_to_checkpoint_s:.2f}"
            print(f"| {workers} | {'notice' if record.notice else 'no notice'} | {notice} | "
                  f"{record.capacity_to_first_step_s:.1f} | {record.down_s:.1f} | "
                  f"{record.lost_steps} |", flush=True)
        print(f"<!-- {workers} workers: {time.perf_counter() - began:.0f} s -->")


if __name__ == "__main__":
    main()
