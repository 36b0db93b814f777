"""The planner's plans for mixtures of experts, from their Hugging Face configs as the hubs
ship them (benchmarks/configs/): Qwen3-30B-A3B with rank-16 LoRA on the attention on 8 RTX
4090s, and fully fine-tuned on 16 H100s; Mixtral-8x7B fully fine-tuned on 16 H100s,
DeepSeek-V2-Lite on 8 and DeepSeek-V3 on 256 (the fewest it fits: 128 need 102 GiB a
device without tensor or pipeline parallelism, which MoE jobs do not take yet). For each,
the best layout with expert parallelism and the best without (FSDP alone), their predicted
step, tokens/s and memory, and the parameters (memory) against the active ones (compute).
Predictions only: no GPU runs them.

    python -m benchmarks.moe_plans
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from raytrain.catalog.hardware import node_shape
from raytrain.core.planner import plan
from raytrain.core.resolve import planner_inputs
from raytrain.spec import JobSpec

CONFIGS = Path(__file__).resolve().parent / "configs"
CASES = [
    ("Qwen3-30B-A3B, LoRA r16 on q/k/v/o, bf16", "qwen3-30b-a3b.json", "rtx4090", 8, 2048,
     16, {"rank": 16, "alpha": 32, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}),
    ("Qwen3-30B-A3B, full fine-tuning, bf16", "qwen3-30b-a3b.json", "h100-sxm", 16, 4096,
     64, None),
    ("Mixtral-8x7B, full fine-tuning, bf16", "mixtral-8x7b.json", "h100-sxm", 16, 4096, 64,
     None),
    ("DeepSeek-V2-Lite, full fine-tuning, bf16", "deepseek-v2-lite.json", "h100-sxm", 8, 4096,
     64, None),
    ("DeepSeek-V3 671B, full fine-tuning, bf16", "deepseek-v3.json", "h100-sxm", 256, 4096,
     2048, None),
]


def _spec(folder: Path, gpu: str, gpus: int, seq: int, batch: int,
          lora: dict[str, Any] | None) -> JobSpec:
    training: dict[str, Any] = {"steps": 1000, "global_batch_size": batch,
                                "micro_batch_size": 1, "precision": "bf16"}
    if lora:
        training["lora"] = lora
    return JobSpec.model_validate({
        "model": {"kind": "hf", "hf": {"path": str(folder), "weights": "random"}},
        "data": {"seq_len": seq}, "training": training, "parallel": {"strategy": "auto"},
        "resources": {"num_workers": gpus, "gpus_per_worker": 1, "accelerator": gpu}})


def main() -> None:
    import tempfile

    for title, config, gpu, gpus, seq, batch, lora in CASES:
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / "config.json").write_text((CONFIGS / config).read_text())
            spec = _spec(Path(folder), gpu, gpus, seq, batch, lora)
            dims, work, kind, _ = planner_inputs(spec)
        work = replace(work, micro_batch_options=(1, 2, 4, 8), recompute_options=("none", "full"))
        plans = plan(dims, work, kind, gpus, shape=node_shape(kind), keep=500)
        best = plans[0]
        fsdp = min((p for p in plans if p.candidate.ep == 1), key=lambda p: p.step_s,
                   default=None)
        print(f"\n{title} on {gpus} x {gpu}, sequence {seq}, {batch} a step: "
              f"{dims.params / 1e9:.2f}B parameters, {dims.active_params / 1e9:.2f}B active")
        for name, p in (("best", best), ("FSDP alone", fsdp)):
            if p is None:
                print(f"  {name}: no layout fits")
                continue
            parts = {k: round(v / p.step_s, 2) for k, v in p.breakdown.items()
                     if k not in ("total",) and v > 0.01 * p.step_s}
            print(f"  {name}: {p.candidate.describe()}: {p.step_s:.2f} s a step, "
                  f"{p.tokens_per_s:,.0f} tokens/s, {p.memory_bytes / 2**30:.1f} GiB a device, "
                  f"MFU {p.mfu:.0%}; shares of the step {json.dumps(parts)}")


if __name__ == "__main__":
    main()
