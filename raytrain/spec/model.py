"""The model section of a job spec: the built-in GPT (its dimensions: raytrain.spec.gpt_config),
a Hugging Face Llama-family model folder mapped onto it (raytrain.spec.hf_model), or a user's
own model by import path, with the shape the planner prices it at.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from raytrain.spec._base import Strict, factory_errors, field_error, raise_if_any, unused_fields
from raytrain.spec.gpt_config import GPTConfig
from raytrain.spec.hf_model import HFSource, derived_gpt


class ModelSpec(Strict):
    """Which model to train: the built-in GPT, or the user's own by import path."""

    kind: Literal["gpt", "hf", "import"] = Field(
        "gpt", description="'gpt' for the built-in decoder, 'hf' for a Hugging Face Llama, "
        "Mistral or Qwen2 folder trained as the built-in decoder, 'import' for a user factory."
    )
    gpt: GPTConfig = Field(default_factory=GPTConfig, description=(
        "Built-in GPT dimensions; for kind 'hf', read from model.hf.path's config.json."))
    hf: HFSource | None = Field(None, description=(
        "For kind 'hf': the model folder, and whether to start from its weights."))
    factory: str | None = Field(
        None,
        max_length=256,
        description="For kind 'import': 'package.module:callable' returning an nn.Module that "
        "maps int64 tokens [batch, seq] to logits [batch, seq, vocab], returned as a tensor, "
        "a tuple whose first item is the logits, or an object with `.logits` (as Hugging "
        "Face models return). The factory is called with model.options as keyword arguments "
        "after torch.manual_seed(training.seed). Only packages the operator allows (service "
        "config allowed_import_packages) are accepted.",
    )
    block_class: str | None = Field(
        None, max_length=200, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="For kind 'import' under FSDP: the class name of the model's repeated "
        "block (LlamaDecoderLayer for a Hugging Face Llama), each sharded as one FSDP unit, "
        "as transformer_layer_cls_to_wrap does elsewhere. null: the largest list of "
        "same-class modules (model.layers, model.model.layers, transformer.h); the job's "
        "status says which units were made (progress.fsdp_units).")
    options: dict[str, Any] = Field(
        default_factory=dict, max_length=64,
        description="Keyword arguments passed to the factory (at most 64; the whole request "
        "body is limited to 1 MiB)."
    )
    shape: GPTConfig | None = Field(
        None, description="For kind 'import': the model's dimensions in model.gpt's terms "
        "(`raytrain plan --model-config` reads them from a Hugging Face config.json), so "
        "strategy 'auto' plans its data-parallel layout (DDP or FSDP, by memory) and the "
        "policy prices it; null: planned as data parallel over the workers, priced by an "
        "assumed speed.")

    @model_validator(mode="before")
    @classmethod
    def _gpt_from_the_folder(cls, data: Any) -> Any:
        """For kind 'hf', model.gpt is the folder's config as the built-in model; one stated
        otherwise is refused (a dumped spec states the same one)."""
        if not isinstance(data, dict) or data.get("kind") != "hf" or not data.get("hf"):
            return data
        source = HFSource.model_validate(data["hf"])
        derived = derived_gpt(source)
        stated = data.get("gpt")
        if stated is not None and GPTConfig.model_validate(stated) != derived:
            raise_if_any("ModelSpec", [field_error(
                ("gpt",), "for kind 'hf' the dimensions are read from model.hf.path's "
                "config.json. To fix: remove model.gpt", "(stated)")])
        return {**data, "gpt": derived}

    @model_validator(mode="after")
    def _factory_matches_kind(self) -> ModelSpec:
        errors = factory_errors(self.kind == "import", self.factory)
        if self.kind == "hf" and self.hf is None:
            errors.append(field_error(("hf",), "kind 'hf' trains a Hugging Face model folder. "
                                      "To fix: set model.hf.path", None))
        unused: tuple[str, ...] = ("factory", "options", "shape", "block_class") \
            if self.builtin else ("gpt",)
        if self.kind != "hf":
            unused += ("hf",)
        errors += unused_fields(self, unused, "model.kind")
        raise_if_any("ModelSpec", errors)
        return self

    @property
    def planned_shape(self) -> GPTConfig | None:
        """The dimensions the planner prices: the built-in GPT's, or an imported model's
        stated shape (None: not known)."""
        return self.gpt if self.builtin else self.shape

    @property
    def builtin(self) -> bool:
        """Trained as the built-in decoder (kind 'gpt', or 'hf' mapped onto it)."""
        return self.kind in ("gpt", "hf")
