"""Any committed checkpoint of a `kind: hf` job, written as a Hugging Face folder, whatever
layout trained it: the model is built in this one process, the checkpoint's model state
loaded into it (DCP reshards FSDP's shards and a pipeline's stages into whole tensors; the
optimizer's state is not read), and the folder written as a job writes `hf/` at its end.
`raytrain export ID --to DIR [--step N]` runs it where the command runs; the job manager
runs `export_to_storage` for `POST /v1/jobs/{id}/export`, into the job's own storage (a
folder or a bucket), in its own process: the model's fp32 weights (4 bytes a parameter) must
fit the head node's memory there, else export where the command runs.

    export_checkpoint(spec, "/runs/ab12/checkpoints/step_000000400", "/models/tuned")
    export_to_storage(spec, ref, "s3://bucket/jobs/ab12/exports/step_000000400")
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from raytrain.errors import FieldError, SpecError
from raytrain.spec import JobSpec

logger = logging.getLogger(__name__)

EXPORT = "export request"  # what a refusal names: the export's own options, not a job spec


def export_checkpoint(spec: JobSpec, checkpoint: str, to: str | Path,
                      merge: bool = False, dtype: str | None = None) -> Path:
    """Write `checkpoint` (a committed checkpoint's folder or s3:// ref) of the job `spec`
    describes as a Hugging Face folder at `to`; the folder. A training.lora job's is its
    adapter as a PEFT folder, or with `merge` the model with the adapter folded in. The
    weights in `dtype` (float32, bfloat16, float16), else the source config's."""
    import torch
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        set_model_state_dict,
    )
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    from raytrain.cloud.object_store import is_remote
    from raytrain.models.hf import export_adapter, export_folder
    from raytrain.models.registry import build_model
    from raytrain.train.bucket_reader import BucketReader
    from raytrain.train.checkpoint import _OPTIONS, _locate, committed

    source = spec.model.hf
    if source is None:
        raise SpecError([FieldError(("model", "kind"), (
            "only a kind 'hf' job's checkpoints are written as a Hugging Face folder (its "
            "config.json comes from model.hf.path). To fix: export a job of kind 'hf'"))],
            EXPORT)
    if not committed(checkpoint):
        raise SpecError([FieldError(("step",), (
            f"{checkpoint} is not a committed checkpoint. To fix: give a step that "
            "`raytrain status` lists as checkpointed"))], EXPORT)
    lora = spec.training.lora
    if merge and lora is None:
        raise SpecError([FieldError(("merge",), (
            "merge folds a training.lora job's adapter into its weights; this job trained "
            "every weight. To fix: export without merge"))], EXPORT)
    model = build_model(spec.model, seed=0)
    if lora is not None:
        from raytrain.models.lora import apply_lora

        apply_lora(model, lora)
    # The names the checkpoint saved them under (torch's model state dict, as training's
    # get_state_dict reads it): a tied head's weight included, under its own name too.
    state = {"model": get_model_state_dict(model, options=_OPTIONS)}
    if is_remote(checkpoint):
        store, name = _locate(checkpoint)
        dcp_load(state, storage_reader=BucketReader(store, name))
    else:
        dcp_load(state, checkpoint_id=checkpoint)
    with torch.no_grad():
        set_model_state_dict(model, state["model"], options=_OPTIONS)
    tie = getattr(model, "tie_weights", None)
    if callable(tie):
        tie()
    if lora is not None and not merge:
        out = export_adapter([model], lora, source.path, to)
    else:
        if lora is not None:
            from raytrain.models.lora import merge as merged

            merged(model)
        out = export_folder([model], source.path, to, spec.model.gpt.tie_embeddings, dtype)
    logger.info("wrote %s as a Hugging Face folder: %s", checkpoint, out)
    return out


def export_to_storage(spec: JobSpec, checkpoint: str, target: str, merge: bool = False,
                      dtype: str | None = None) -> str:
    """export_checkpoint into `target` (a folder or an s3:// prefix): written in a local
    folder first, then each file put in place; `target`."""
    from raytrain.cloud.object_store import open_store

    with tempfile.TemporaryDirectory(prefix="raytrain-export-") as tmp:
        folder = export_checkpoint(spec, checkpoint, Path(tmp) / "hf", merge, dtype)
        store = open_store(target)
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            store.put_file(path, path.relative_to(folder).as_posix())
    return target
