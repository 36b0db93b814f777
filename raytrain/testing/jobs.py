"""Things tests hand to raytrain by import path, a sink that records every report, and a job
the planner and the policy are asked about."""

from __future__ import annotations

from typing import Any

import torch

from raytrain.spec import Offer

# Spot only, with checkpoints and restarts as cheap as a tiny test job's (milliseconds, about a
# second), so that the policy's checkpoint intervals are seconds, as minutes are for a real job.
SPOT_TEST_POLICY = {"name": "spot-test", "description": "spot only, with a tiny job's costs",
                    "markets": ["spot"], "checkpoint_cost_s": 0.05, "restart_s": 1.0,
                    "ready_s": 1.0}


def gpt_1b_job(accelerator: str, **sections: Any) -> dict[str, Any]:
    """A 1B-class GPT (16 x 2048, bf16, 20,000 steps of 64 x 2048 tokens) on 8 devices of
    `accelerator`, as a job document; `sections` (parallel, capacity, ...) are added."""
    return {
        "model": {"gpt": {"vocab_size": 32000, "dim": 2048, "num_layers": 16, "num_heads": 16,
                          "max_seq_len": 2048}},
        "data": {"seq_len": 2048},
        "training": {"steps": 20000, "global_batch_size": 64, "micro_batch_size": 4,
                     "precision": "bf16"},
        "resources": {"num_workers": 8, "gpus_per_worker": 1, "accelerator": accelerator},
        **sections,
    }


class RecordingSink:
    """Records every report; asks the loop to stop once `stop_at_step` is reported."""

    def __init__(self, stop_at_step: int | None = None) -> None:
        self.stop_at_step = stop_at_step
        self.started_at: list[int] = []
        self.reports: list[dict[str, Any]] = []
        self.checkpoints: list[int] = []
        self.result: dict[str, Any] | None = None

    def started(self, resumed_step: int) -> None:
        self.started_at.append(resumed_step)

    def progress(self, payload: dict[str, Any]) -> None:
        self.reports.append(payload)

    def checkpoint(self, step: int, path: str, save_s: float,
                   durable_s: float | None = None) -> None:
        assert save_s >= 0
        self.checkpoints.append(step)

    def finished(self, result: dict[str, Any]) -> None:
        self.result = result

    def checkpoint_every_s(self) -> float | None:
        return None  # no service: only every checkpoint_every_steps

    def step_rows(self) -> dict[int, list[Any]]:
        """Every step's row ([step, loss, lr, grad_norm, tokens]) the reports carried."""
        return {row[0]: row for report in self.reports for row in report.get("steps", [])}

    def should_stop(self) -> bool:
        return self.stop_at_step is not None and any(
            r["step"] >= self.stop_at_step for r in self.reports
        )

    def should_move(self) -> bool:
        return False

    def losses(self) -> dict[int, float]:
        return {r["step"]: r["loss"] for r in self.reports}


class CountingDataset:
    """A user dataset: item i is the tokens i, i+1, ... modulo 50."""

    def __init__(self, seq_len: int) -> None:
        self.seq_len = seq_len

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, index: int) -> torch.Tensor:
        return (torch.arange(self.seq_len + 1) + index) % 50


def make_dataset(seq_len: int) -> CountingDataset:
    return CountingDataset(seq_len)


def make_tiny_model(vocab_size: int = 50, dim: int = 16) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Embedding(vocab_size, dim),
                               torch.nn.Linear(dim, vocab_size))


class NoticeAfter:
    """An interruption notice heard by one rank only, after `syncs` loss syncs."""

    def __init__(self, rank: int, syncs: int, rebalance_first: bool = False) -> None:
        self.rank, self.syncs, self.rebalance_first = rank, syncs, rebalance_first
        self.calls = 0
        self.noticed_at: float | None = None

    def _mine(self) -> bool:
        import torch.distributed as dist

        return dist.get_rank() == self.rank

    def take_checkpoint_request(self) -> bool:
        self.calls += 1
        return self._mine() and self.rebalance_first and self.calls == self.syncs - 1

    @property
    def stop_requested(self) -> bool:
        return self._mine() and self.calls >= self.syncs


def make_hf_llama(vocab_size: int = 64, hidden_size: int = 32, num_layers: int = 4,
                  num_heads: int = 4, num_kv_heads: int = 2) -> torch.nn.Module:
    """A user's Hugging Face model as `transformers` builds it: a tiny LlamaForCausalLM (its
    blocks in model.model.layers, an nn.ModuleList; its forward returns an output object)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size,
                         intermediate_size=hidden_size * 2, num_hidden_layers=num_layers,
                         num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                         max_position_embeddings=64, use_cache=False, tie_word_embeddings=False)
    return LlamaForCausalLM(config)


class DictOutputModel(torch.nn.Module):
    """Returns {'logits': ...}, or with `broken` a bare hidden state, to try the contract."""

    def __init__(self, vocab_size: int = 50, dim: int = 16, broken: bool = False) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, dim)
        self.head = torch.nn.Linear(dim, vocab_size)
        self.broken = broken

    def forward(self, tokens: torch.Tensor) -> Any:
        hidden = self.embed(tokens)
        return hidden.sum(-1) if self.broken else {"logits": self.head(hidden)}


def make_dict_output_model(broken: bool = False) -> torch.nn.Module:
    return DictOutputModel(broken=broken)


OFFER = {"provider": "local", "region": "here", "instance_type": "cpu-1", "gpu_kind": "cpu",
         "gpus_per_node": 1, "intra_link": "gloo-local", "network_gbps": 10,
         "on_demand_usd_per_hour": 1.0, "spot_usd_per_hour": 0.3,
         "spot_interruptions_per_hour": 0.05}


def job(steps: int = 160) -> dict:
    return {"name": "five-faults",
            "model": {"gpt": {"vocab_size": 128, "dim": 32, "num_layers": 2, "num_heads": 4,
                              "max_seq_len": 16}},
            "data": {"seq_len": 16},
            "training": {"steps": steps, "global_batch_size": 8, "micro_batch_size": 4,
                         "checkpoint_every_steps": 10, "learning_rate": 0.01},
            "resources": {"num_workers": 1, "cpus_per_worker": 1}}


def offer(name: str, gpu: str = "h100-sxm", link: str = "nvlink4", gpus: int = 8,
          on_demand: float | None = 20.0, spot: float | None = 10.0, rate: float = 0.01,
          gbps: float = 3200, rdma: bool = True) -> Offer:
    return Offer(provider="test", region="r", instance_type=name, gpu_kind=gpu,
                 gpus_per_node=gpus, intra_link=link, network_gbps=gbps, rdma=rdma,
                 on_demand_usd_per_hour=on_demand, spot_usd_per_hour=spot,
                 spot_interruptions_per_hour=rate)
