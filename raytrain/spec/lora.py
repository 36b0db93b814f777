"""training.lora: low-rank adapters (LoRA: Hu et al., 2021) trained beside frozen base weights,
named and scaled as Hugging Face's PEFT names and scales them (`alpha / rank`), so an adapter
raytrain trains loads in `peft` and a PEFT user's settings mean the same here.

    training: {lora: {rank: 16, alpha: 32, targets: [q_proj, k_proj, v_proj, o_proj]}}
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from raytrain.spec._base import Strict

# PEFT's name of each linear a Llama-family block has: the built-in model's.
TARGETS = {"q_proj": "attention.wq", "k_proj": "attention.wk", "v_proj": "attention.wv",
           "o_proj": "attention.wo", "gate_proj": "feed_forward.w1",
           "up_proj": "feed_forward.w3", "down_proj": "feed_forward.w2"}
Target = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraSpec(Strict):
    """Low-rank adapters on the named linears of every block; everything else frozen."""

    rank: int = Field(16, ge=1, le=4_096, description="The adapters' rank r.")
    alpha: float = Field(32.0, gt=0, le=1e6, description="Their scale is alpha / rank (PEFT's "
                         "lora_alpha).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on an adapter's input "
                           "(PEFT's lora_dropout).")
    targets: list[Target] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1, max_length=7,
        description="The linears adapted, by PEFT's names (the Llama family's): q_proj, "
        "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj.")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank
