"""What the command line draws: tables that fit 80 columns, and figures in units people read.

    out.print(jobs_table(jobs)); out.print(plans_table(response))
    duration_text(0.000085 * 3600)   # "0.31 s", not "8.51e-05 h"
    usd_text(0.0021)                 # "$0.0021", not "$0.00"
"""

from __future__ import annotations

import math
import time
from dataclasses import fields
from typing import Any, Sequence

from rich import box
from rich.table import Table

from raytrain.spec import (
    CostFigure,
    JobStatus,
    Layout,
    OfferCatalog,
    OffersResponse,
    PlanResponse,
    PlanRow,
    PreemptionRecord,
    StepRecord,
)


def duration_text(seconds: float | None) -> str:
    """A duration in the largest unit that keeps it readable: 0.31 s, 4.2 min, 3.1 h, 2.5 d."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size * 0.95 or (unit == "min" and seconds >= 60):
            return f"{seconds / size:.2g} {unit}" if seconds / size < 10 else \
                f"{seconds / size:,.0f} {unit}"
    if seconds >= 1:
        return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 0.001:
        return "<1 ms"
    return f"{seconds * 1000:.2g} ms" if seconds < 0.1 else f"{seconds:.2f} s"


def usd_text(value: float | None) -> str:
    """Dollars with cents, or two significant figures below a dollar: $0.0021, $0.35, $12.50."""
    if value is None:
        return "-"
    if value == 0:
        return "$0"
    if abs(value) < 0.0001:
        return "<$0.0001"
    if abs(value) < 1:  # two significant figures, never an exponent
        return f"${value:.{max(2, 1 - math.floor(math.log10(abs(value))))}f}"
    return f"${value:,.2f}"


def rate_text(per_hour: float) -> str:
    """How often something happens to one node: every 3.2 h, every 107 d, never."""
    if per_hour <= 0:
        return "never"
    return "every " + duration_text(3600 / per_hour)


def count_text(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 1e6:
        return f"{value / 1e6:.3g}M"
    if value >= 1e4:
        return f"{value / 1e3:.3g}k"
    return f"{value:,.0f}" if value >= 10 else f"{value:.2g}"


def _compact(title: str | None = None) -> Table:
    return Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False,
                 collapse_padding=True, show_edge=False, title_justify="left")


def jobs_table(jobs: Sequence[JobStatus]) -> Table:
    table = _compact()
    for column in ("ID", "NAME", "STATE", "STEP", "LOSS", "TOK/S", "$", "AGE"):
        table.add_column(column, no_wrap=column in ("ID", "STATE"),  # IDs get copied
                         justify="left" if column in ("ID", "NAME", "STATE") else "right")
    now = time.time()
    for job in jobs:
        p = job.progress
        table.add_row(
            job.id, job.spec.name, job.state.value, f"{p.step}/{p.total_steps}",
            "-" if p.loss is None else f"{p.loss:.4f}", count_text(p.tokens_per_s),
            usd_text(job.cost_usd), duration_text(now - job.created_at),
        )
    return table


def steps_table(steps: list[StepRecord], validation: dict[int, float] | None = None
                ) -> Table:
    """Every step's row of a job's history: step, loss, validation loss (`validation`: by the
    step it was measured after), learning rate, gradient norm, tokens."""
    validation = validation or {}
    table = Table(box=None)
    for name in ("step", "loss", "val loss", "lr", "grad norm", "tokens"):
        table.add_column(name, justify="right")
    for row in steps:
        table.add_row(str(row.step), *("-" if v is None else f"{v:.6g}" for v in (
            row.loss, validation.get(row.step), row.lr, row.grad_norm)),
                      "-" if row.tokens is None else str(row.tokens))
    return table


def status_table(job: JobStatus) -> Table:
    table = Table(show_header=False, box=None)
    table.add_column("what", no_wrap=True)
    table.add_column("value", overflow="fold")  # paths are copied: fold, never cut
    p, r, plan = job.progress, job.resources, job.plan
    rows = [
        ("id", job.id),
        ("name", job.spec.name),
        ("state", job.state.value + (f" ({job.message})" if job.message else "")),
        *([("warning", job.warning)] if job.warning and not job.state.is_terminal else []),
        ("plan", f"{plan.strategy}: {plan.description}, {plan.backend}, grad accum "
                 f"{plan.grad_accum_steps}" if plan else "-"),
    ]
    if plan is not None and (plan.predicted_step_s or plan.measured_step_s):
        rows.append(("step time", f"predicted {duration_text(plan.predicted_step_s)}, "
                                  f"measured {duration_text(plan.measured_step_s)}"))
    rows += [
        ("step", f"{p.step}/{p.total_steps}"),
        ("loss", "-" if p.loss is None else f"{p.loss:.4f} (first {p.first_loss:.4f})"
         if p.first_loss is not None else f"{p.loss:.4f}"),
        *([("validation loss", f"{p.val_loss:.4f} after step {p.val_step}")]
          if p.val_loss is not None else []),
        *([("experts", f"balancing loss {p.balance_loss:.4f}, busiest expert "
                       f"{p.expert_imbalance or 0:.2f}x the mean")]
          if p.balance_loss is not None else []),
        ("tokens/s", count_text(p.tokens_per_s) + (" (at the last report)"
                                                  if p.tokens_per_s else "")),
        ("elapsed / ETA", f"{duration_text(p.elapsed_s)} / " + (
            "ended" if job.state.is_terminal else duration_text(p.eta_s))),
        ("resources", f"{r.accelerator}, {r.market}, {r.nodes} node(s), {r.cpus:g} CPU, "
                      f"{r.gpus:g} GPU, {usd_text(r.usd_per_hour)}/h"),
        ("cost", usd_text(job.cost_usd)),
        ("restarts / preemptions", f"{job.restarts} / {job.preemptions}"),
        ("checkpoint",
         f"step {job.checkpoint.step}: {job.checkpoint.path}" if job.checkpoint else "-"),
    ]
    if job.tracking is not None:  # its runs in the trackers, and why one lags
        rows += [(f"{name} run", run.url or run.run_id or "-")
                 for name, run in job.tracking.runs.items()]
        if job.tracking.warning:
            rows.append(("tracking", job.tracking.warning))
    if job.groups:  # an elastic job's replica groups
        rows.append(("replica groups", ", ".join(f"{g.index} {g.state}" for g in job.groups)
                     + (f"; {p.groups} in the latest step" if p.groups else "")))
    for record in job.preemption_log[-3:]:  # the latest preemptions and what they cost
        rows.append(("preemption", preemption_text(record)))
    if job.decisions:  # bought capacity: what the policy prices with, measured or assumed
        costs = job.costs
        for key, figure in (("checkpoint stall", costs.checkpoint_stall_s),
                            ("restart", costs.restart_s), ("nodes ready", costs.ready_s)):
            rows.append((key, cost_figure_text(figure)))
    if job.error:
        rows.append(("error", job.error))
    for key, value in rows:
        table.add_row(f"[bold]{key}", value)
    return table


def preemption_text(record: PreemptionRecord) -> str:
    """One preemption in a line: what was lost, what it cost the survivors, how it ended."""
    notice = "after a notice" if record.notice else "without notice"
    if record.group is not None:
        replaced = "replacement on its way" if record.replaced_after_s is None else \
            f"replaced after {duration_text(record.replaced_after_s)}"
        return (f"group {record.group} lost {notice} at step {record.reached_step}: "
                f"{record.lost_steps} step(s) redone, {record.survivors} trained on "
                f"(stall {duration_text(record.stall_s)}), {replaced}")
    return (f"{notice} at step {record.reached_step}: {record.lost_steps} step(s) lost, down "
            f"{duration_text(record.down_s)}, {usd_text(record.extra_cost_usd)}")


def cost_figure_text(figure: CostFigure) -> str:
    """'measured 2.1 s (3 samples), assumed 60 s: the policy uses 2.1 s'."""
    measured = "not measured yet" if figure.measured_s is None else \
        f"measured {duration_text(figure.measured_s)} ({figure.samples} sample" \
        f"{'' if figure.samples == 1 else 's'})"
    assumed = "-" if figure.assumed_s is None else duration_text(figure.assumed_s)
    used = "" if figure.used_s is None else f": the policy uses {duration_text(figure.used_s)}"
    return f"{measured}, assumed {assumed}{used}"


def summary_table(job: JobStatus, wall_s: float | None = None) -> Table:
    table = Table(title=f"job {job.id} {job.state.value}", show_header=False)
    table.add_column("what", no_wrap=True)
    table.add_column("value", overflow="fold")  # paths are copied: fold, never truncate
    result = job.result
    if result is not None:
        table.add_row("loss", f"{result.first_loss:.4f} -> {result.final_loss:.4f}")
        table.add_row("steps", str(result.steps))
        table.add_row("throughput", f"{result.tokens_per_s:,.0f} tokens/s (the run's "
                      "average; the bar showed the latest)")
        table.add_row("training time", f"{result.train_wall_s:.1f} s")
    if wall_s is not None:
        table.add_row("wall time", f"{wall_s:.1f} s (submit to end)")
    table.add_row("restarts", str(job.restarts))
    if job.checkpoint:
        table.add_row("checkpoint", job.checkpoint.path)
    if job.error:
        table.add_row("error", job.error)
        table.add_row("worker output", f"raytrain logs {job.id}")
    return table


def plans_table(response: PlanResponse) -> Table:
    table = _compact(f"{response.gpus} x {response.accelerator} on {response.shape} nodes, "
                     f"{response.precision} (catalog {response.catalog_version})"
                     + (", fastest first" if len(response.plans) > 1 else ""))
    for column in ("#", "layout", "step", "tok/s", "TF/s", "MFU", "GiB/dev", "scale",
                   "$/Mtok"):
        table.add_column(column, no_wrap=column != "layout",
                         justify="left" if column == "layout" else "right")
    for row in response.plans:
        table.add_row(
            str(row.rank), row.layout, duration_text(row.step_s), count_text(row.tokens_per_s),
            f"{row.tflops_per_gpu:.3g}", f"{row.mfu:.0%}",
            f"{row.memory_gib:.3g}/{row.memory_limit_gib:.0f}"
            if row.memory_gib >= 0.1 else f"{row.memory_gib * 1024:.3g} MiB",
            f"{row.scaling_efficiency:.0%}", usd_text(row.usd_per_million_tokens),
        )
    return table


def plans_json(response: PlanResponse) -> dict[str, Any]:
    """`raytrain plan --json`: each plan's layout as an object, then its figures."""
    degrees = [f.name for f in fields(Layout) if f.name in PlanRow.model_fields]
    head = response.model_dump(mode="json", exclude={"plans"})
    plans = []
    for row in response.plans:
        figures = row.model_dump(mode="json", exclude={"rank", "layout", *degrees})
        layout = {"description": row.layout, **{k: getattr(row, k) for k in degrees}}
        plans.append({"layout": layout, **figures})
    return {**head, "plans": plans}


_LINKS = {"nvlink4": "NVLink", "pcie4-p2p": "PCIe", "pcie4-no-p2p": "PCIe no-P2P"}


def offers_table(response: OffersResponse, catalog: OfferCatalog) -> Table:
    table = _compact(f"offers (catalog {catalog.version}, {catalog.source}); $ per node-hour; "
                     "how often one spot node is lost")
    for column in ("provider", "instance", "GPUs", "link", "Gb/s", "on-dem", "spot", "lost"):
        table.add_column(column, no_wrap=column != "link", min_width=6 if column == "lost"
                         else None, justify="left" if column in (
                             "provider", "instance", "GPUs", "link") else "right")
    for o in response.offers:
        table.add_row(o.provider, o.instance_type, f"{o.gpus_per_node}x {o.gpu_kind}",
                      _LINKS.get(o.intra_link, o.intra_link),
                      f"{o.network_gbps:g}" + ("*" if o.rdma else ""),
                      usd_text(o.on_demand_usd_per_hour),
                      usd_text(o.spot_usd_per_hour) + ("" if o.spot_joins_cluster else "†"),
                      "-" if o.spot_usd_per_hour is None
                      else rate_text(o.spot_interruptions_per_hour).removeprefix("every "))
    table.caption = "* RDMA (EFA / InfiniBand)"
    if any(not o.spot_joins_cluster and o.spot_usd_per_hour is not None
           for o in response.offers):
        table.caption += ("; † shown for comparison, not bought: these spot nodes cannot "
                          "join the cluster (RunPod's interruptible pods have no private "
                          "network to the head)")
    table.caption_justify = "left"
    return table


def seen_table(response: OffersResponse) -> Table | None:
    """Where this service has held spot capacity: the preemptions it saw there, beside the
    catalog's prior and the rate the policy uses now (the prior updated by them); None
    where it has held none."""
    seen = [r for r in response.observed if r.spot_node_hours > 0]
    if not seen:
        return None
    table = _compact("spot preemptions this service has seen; how often one node is lost")
    for column in ("offer", "preemptions", "node-hours", "prior", "now"):
        table.add_column(column, no_wrap=True, justify="left" if column == "offer" else "right")
    for r in seen:
        table.add_row(r.offer, f"{r.preemptions}", f"{r.spot_node_hours:,.1f}",
                      rate_text(r.prior_per_node_hour).removeprefix("every "),
                      rate_text(r.estimate_per_node_hour).removeprefix("every "))
    return table


def ranking_table(response: OffersResponse, title: str) -> Table:
    table = _compact(title)
    for column in ("#", "nodes x offer", "market", "$/h", "tok/s", "layout", "time",
                   "$ total", "ckpt"):
        table.add_column(column, no_wrap=column != "layout",
                         overflow="fold" if column == "layout" else "ellipsis",
                         justify="left" if column in ("nodes x offer", "layout", "market")
                         else "right")
    for row in response.ranking:
        table.add_row(str(row.rank), f"{row.nodes}x {row.instance_type}", row.market,
                      usd_text(row.usd_per_hour), count_text(row.tokens_per_s), row.layout,
                      duration_text(row.expected_hours * 3600),
                      usd_text(row.expected_cost_usd),
                      duration_text(row.checkpoint_interval_s))
    return table


def simulation_table(rows: Sequence[object], title: str, policy_name: str) -> Table:
    notices = sorted({row.notice_s for row in rows})
    several = len(notices) > 1  # else the one notice goes in the title
    table = _compact(title + ("" if several else f", notice {notices[0]:g} s" if notices
                              else ""))
    for column in ("trace", *(("notice",) if several else ()), "strategy", "mean $",
                   "worst/od", "hours", "late", "preempt", "lost h"):
        table.add_column(column, no_wrap=True,
                         justify="left" if column in ("trace", "strategy") else "right")
    for row in rows:
        worst = getattr(row, "worst_regret", None)
        table.add_row(row.trace, *((f"{row.notice_s:g} s",) if several else ()),
                      row.strategy if row.strategy != "policy" else
                      f"policy ({policy_name})", usd_text(row.mean_cost_usd),
                      "-" if worst is None else f"{1 + worst:.2f}",
                      f"{row.mean_hours:.2f}", f"{row.deadline_misses}/{row.runs}",
                      f"{row.mean_preemptions:.1f}", f"{row.mean_lost_work_hours:.2f}")
    return table
