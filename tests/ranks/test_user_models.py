"""A model of the user's own (model.kind 'import'): what its forward may return (the
contract in the README), and FSDP over its repeated blocks, a Hugging Face Llama's included.

The FSDP test measures what FSDP exists to save: the parameter bytes a rank holds gathered
(unsharded) at its peak during a forward and backward, with one FSDP unit per decoder block
against one unit at the root. Break `transformer_blocks` (return []) and it fails."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from raytrain.core.resolve import job_layout
from raytrain.errors import SpecError, TrainingError
from raytrain.models.contract import logits_of
from raytrain.parallel.blocks import describe_units, transformer_blocks
from raytrain.spec import JobSpec
from raytrain.testing.jobs import RecordingSink, make_hf_llama
from raytrain.train.loop import train
from raytrain.train.rank import WorkerInfo
from tests.support.tolerances import SUM_ORDER

pytest.importorskip("transformers")


def _job(num_workers: int, strategy: str, factory: str, **model: Any) -> JobSpec:
    return JobSpec.model_validate({
        "model": {"kind": "import", "factory": factory, **model},
        "data": {"kind": "import", "seq_len": 16, "factory": "raytrain.testing.jobs:make_dataset",
                 "options": {"seq_len": 16}},
        "training": {"steps": 6, "global_batch_size": 4, "micro_batch_size": 2,
                     "checkpoint_every_steps": 100, "learning_rate": 0.01},
        "resources": {"num_workers": num_workers},
        "parallel": {"strategy": strategy},
    })


def test_logits_come_out_of_a_tensor_a_tuple_a_mapping_or_an_output_object() -> None:
    logits = torch.zeros(2, 3, 5)

    class Output:  # as transformers' CausalLMOutputWithPast
        def __init__(self) -> None:
            self.logits = logits

    for output in (logits, (logits, None), [logits], {"logits": logits}, Output()):
        assert logits_of(output) is logits
    with pytest.raises(TrainingError, match=r"logits \[batch, seq, vocab\].*\.logits"):
        logits_of(torch.zeros(2, 3))
    with pytest.raises(TrainingError, match="returned dict"):
        logits_of({"hidden": logits})


def test_a_hugging_face_model_and_a_dict_output_train_and_a_bad_output_says_the_contract(
        tmp_path: Path) -> None:
    for factory in ("raytrain.testing.jobs:make_hf_llama",
                    "raytrain.testing.jobs:make_dict_output_model"):
        sink = RecordingSink()
        spec = _job(1, "data", factory)
        train(spec, WorkerInfo.single_process(), sink, tmp_path / factory,
              layout=job_layout(spec), progress_interval_s=0.0)
        losses = sink.losses()
        assert len(losses) == 6 and losses[6] < losses[1], factory
    broken = _job(1, "data", "raytrain.testing.jobs:make_dict_output_model")
    broken = broken.model_copy(update={"model": broken.model.model_copy(
        update={"options": {"broken": True}})})
    with pytest.raises(TrainingError, match="DictOutputModel's forward returned a tensor of "
                       r"shape \(2, 16\).*Hugging Face"):
        train(broken, WorkerInfo.single_process(), RecordingSink(), tmp_path / "broken",
              layout=job_layout(broken))


def test_the_repeated_blocks_are_found_or_named() -> None:
    llama = make_hf_llama(num_layers=3)
    blocks = transformer_blocks(llama)
    assert [type(b).__name__ for b in blocks] == ["LlamaDecoderLayer"] * 3
    assert blocks == list(llama.model.layers)
    assert transformer_blocks(llama, "LlamaDecoderLayer") == blocks
    assert describe_units(llama, blocks) == "3 x LlamaDecoderLayer, then the rest at the root"
    with pytest.raises(SpecError, match="model.block_class.*LlamaDecoderLayer"):
        transformer_blocks(llama, "DecoderLayer")
    flat = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    assert transformer_blocks(flat) == []  # no repeated blocks: the root is the one unit
    assert describe_units(flat, []) == "1 unit: the whole Sequential at its root"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _gathered_peak_bytes(model: nn.Module) -> int:
    """The most parameter bytes this rank held unsharded at once, over a forward and a
    backward: sampled before every leaf module runs, forward and backward."""
    peak = [0]

    def sample(*_: Any) -> None:
        held = sum(p.numel() * p.element_size() for p in model.parameters()
                   if not isinstance(p, DTensor))
        held += sum(p.to_local().numel() * p.element_size() for p in model.parameters()
                    if isinstance(p, DTensor))
        peak[0] = max(peak[0], held)

    for module in model.modules():
        if not any(True for _ in module.children()):
            module.register_forward_pre_hook(sample)
            module.register_full_backward_pre_hook(sample)
    tokens = torch.randint(0, 64, (2, 16))
    logits_of(model(tokens)).sum().backward()
    return peak[0]


def _fsdp_worker(rank: int, port: int, root: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        from raytrain.parallel.fsdp import apply_fsdp

        mesh = init_device_mesh("cpu", (2,))
        per_block = make_hf_llama(hidden_size=64, num_layers=6)
        units = apply_fsdp(per_block, mesh, reshard_after_forward=True)
        one_unit = make_hf_llama(hidden_size=64, num_layers=6)
        fully_shard(one_unit, mesh=mesh)
        whole = make_hf_llama(hidden_size=64, num_layers=6)
        total = sum(p.numel() * p.element_size() for p in whole.parameters())
        block = sum(p.numel() * p.element_size() for p in whole.model.layers[0].parameters())
        peaks = {"per_block": _gathered_peak_bytes(per_block),
                 "one_unit": _gathered_peak_bytes(one_unit), "total": total, "block": block,
                 "units": units}
        sink = RecordingSink()
        spec = _job(2, "fsdp", "raytrain.testing.jobs:make_hf_llama")
        train(spec, WorkerInfo.from_process_group(torch.device("cpu")), sink, Path(root),
              layout=job_layout(spec), progress_interval_s=0.0)
        if rank == 0:
            Path(out).write_text(json.dumps({**peaks, "losses": sink.losses(),
                                             "reported": sink.reports[-1].get("fsdp_units")}))
    finally:
        dist.destroy_process_group()


def test_fsdp_shards_a_hugging_face_llama_one_decoder_block_at_a_time(tmp_path: Path) -> None:
    reference = RecordingSink()
    spec = _job(1, "data", "raytrain.testing.jobs:make_hf_llama")
    train(spec, WorkerInfo.single_process(), reference, tmp_path / "single",
          layout=job_layout(spec), progress_interval_s=0.0)
    out = tmp_path / "fsdp.json"
    mp.spawn(_fsdp_worker, args=(_free_port(), str(tmp_path / "fsdp"), str(out)), nprocs=2)
    got = json.loads(out.read_text())
    print(f"parameter bytes held at the peak, per rank: {got['per_block']} per block, "
          f"{got['one_unit']} as one unit, of {got['total']} in the model "
          f"({got['block']} a block)")
    assert got["units"] == "6 x LlamaDecoderLayer, then the rest at the root"
    assert got["reported"] == "4 x LlamaDecoderLayer, then the rest at the root"
    assert got["one_unit"] >= got["total"]  # the whole model gathered at once
    # Per block: this rank's half of every block, and at most two blocks whole (the one
    # running and the one prefetched), beside the root's (embeddings, head) few bytes.
    assert got["per_block"] <= got["total"] / 2 + 2 * got["block"] < got["one_unit"]
    losses = {int(k): v for k, v in got["losses"].items()}
    for step, loss in reference.losses().items():
        assert losses[step] == pytest.approx(loss, abs=SUM_ORDER), step
