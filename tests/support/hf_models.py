"""Tiny Hugging Face models of each supported family, made with transformers and written with
`save_pretrained` (nothing from a hub), and a job spec that trains one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

SHAPE = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
         "rms_norm_eps": 1e-5}
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": False}),
    "llama3_tied": ("LlamaConfig", "LlamaForCausalLM", {
        "tie_word_embeddings": True, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None,
                                                        "tie_word_embeddings": False}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": False,
                                                  "use_sliding_window": False}),
    # Heads twice hidden_size / heads wide, as Qwen3's are (0.6B: 16 x 128 over 1,024).
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"tie_word_embeddings": False,
                                                  "head_dim": 16, "use_sliding_window": False}),
}


def make_folder(family: str, folder: Path, seed: int = 0, **overrides: Any) -> Path:
    """A randomly initialised `family` model saved to `folder` (fp32 safetensors)."""
    import transformers

    config_name, model_name, extra = FAMILIES[family]
    config = getattr(transformers, config_name)(**{**SHAPE, **extra, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).float().eval()
    with torch.no_grad():  # biases start at 0 and norms' scales at 1: values to check
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.1)
            elif name.endswith("norm.weight"):
                param.normal_(1.0, 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def hf_logits(folder: Path, tokens: torch.Tensor) -> torch.Tensor:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    with torch.no_grad():
        return model.eval()(tokens).logits


def hf_job(folder: Path, steps: int = 4, **sections: Any) -> dict[str, Any]:
    return {"model": {"kind": "hf", "hf": {"path": str(folder)}},
            "data": {"seq_len": 16},
            "training": {"steps": steps, "global_batch_size": 8, "micro_batch_size": 2,
                         "checkpoint_every_steps": steps, "learning_rate": 0.01},
            "resources": {"num_workers": 1},
            **sections}
