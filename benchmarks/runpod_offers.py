"""The policy on the shipped offers: for the demo-size job and a 7B-class job with a 24-hour
deadline, the best option on each of RunPod's RTX 4090 and H100 pods (on-demand, and
interruptible as cluster/runpod.yaml's pod types rent them: one pod a job, over SSH) and on
AWS p5 spot, with its expected dollars per million tokens, and the policy's choice. Pure
arithmetic on the catalog and the planner: no cloud is called.

    python -m benchmarks.runpod_offers
"""

from __future__ import annotations

from pathlib import Path

from raytrain.cloud.cluster_configs import load_cluster_config, pod_types
from raytrain.core.autoscale import choose, options
from raytrain.core.throughput import job_goal, job_throughput
from raytrain.spec import JobSpec
from raytrain.spec.files import load_policies, snapshot

JOBS = {
    "demo-size (GPT 2 x 128, 150 steps)": {
        "name": "demo", "model": {"gpt": {"vocab_size": 256, "dim": 128, "num_layers": 2,
                                          "num_heads": 4, "max_seq_len": 64}},
        "data": {"seq_len": 64}, "training": {"steps": 150, "global_batch_size": 16,
                                              "micro_batch_size": 4},
        "parallel": {"strategy": "auto"},
        "resources": {"num_workers": 1, "gpus_per_worker": 1, "accelerator": "rtx4090"}},
    "7B-class (32 x 4096, 2.1B tokens, bf16, 24 h deadline)": {
        "name": "seven-b", "model": {"gpt": {"vocab_size": 32000, "dim": 4096, "num_layers": 32,
                                             "num_heads": 32, "max_seq_len": 4096}},
        "data": {"seq_len": 4096}, "training": {"steps": 2000, "global_batch_size": 256,
                                                "micro_batch_size": 1, "precision": "bf16"},
        "parallel": {"strategy": "auto"},
        "resources": {"num_workers": 8, "gpus_per_worker": 1, "accelerator": "rtx4090"},
        "capacity": {"deadline_hours": 24}},
}
CLUSTER = Path(__file__).resolve().parents[1] / "cluster" / "runpod.yaml"
CHOICES = [("runpod", "rtx4090", "spot"), ("runpod", "rtx4090", "on-demand"),
           ("runpod", "h100-sxm", "spot"), ("runpod", "h100-sxm", "on-demand"),
           ("aws", "h100-sxm", "spot")]


def main() -> None:
    catalog, policy = snapshot(), load_policies()["cost-first"]
    # What the service on cluster/runpod.yaml buys: its pod types take RunPod's spot market
    # (one pod a job, over SSH), as the provisioner applies them.
    served, _ = pod_types(load_cluster_config(CLUSTER), catalog)
    catalog = catalog.with_pods({b.offer for b in served.values()})
    print(f"catalog {catalog.version} (snapshot, with {CLUSTER.name}'s pod types); policy "
          f"{policy.name}")
    for title, document in JOBS.items():
        spec = JobSpec.model_validate(document)
        goal = job_goal(spec)
        print(f"\n{title}: {goal.tokens_left / 1e6:,.1f} M tokens")
        print(f"{'offer':30} {'market':10} {'nodes':>5} {'tokens/s':>10} {'$/h':>8} "
              f"{'hours':>8} {'$':>10} {'$/M tok':>8}  layout")
        for provider, kind, market in CHOICES:
            for accelerator in (kind,):
                job = JobSpec.model_validate({**document, "resources": {
                    **document["resources"], "accelerator": accelerator}})
                found = [o for o in options(job_goal(job), catalog.offers, job_throughput(job),
                                            policy, markets=(market,))
                         if o.offer.provider == provider]
                if not found:
                    unbought = market == "spot" and not any(
                        o.spot_joins_cluster for o in catalog.offers
                        if o.provider == provider and o.gpu_kind == kind)
                    print(f"{provider + ' ' + kind:30} {market:10} " + (
                        "not bought: its spot nodes join no cluster" if unbought
                        else "nothing fits"))
                    continue
                best = found[0]
                print(f"{best.offer.id:30} {market:10} {best.nodes:>5} "
                      f"{best.tokens_per_s:>10,.0f} {best.usd_per_hour:>8.2f} "
                      f"{best.expected_hours:>8.2f} {best.expected_cost_usd:>10,.2f} "
                      f"{1e6 * best.expected_cost_usd / goal.tokens_left:>8.3f}  {best.layout}")
        for accelerator in ("rtx4090", "h100-sxm"):
            job = JobSpec.model_validate({**document, "resources": {
                **document["resources"], "accelerator": accelerator}})
            decision = choose(job_goal(job), catalog.offers, job_throughput(job), policy)
            print(f"policy's choice with accelerator {accelerator}: {decision.reason}")


if __name__ == "__main__":
    main()
