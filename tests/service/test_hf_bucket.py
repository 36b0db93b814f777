"""A Hugging Face model folder in a bucket (moto's S3 server on 127.0.0.1): its config is read
at submit, its tensors' shapes are checked from the safetensors headers, and each rank
fetches only the rows it holds (raytrain.models.hf_bucket), loading the same weights as from
the folder on disk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from raytrain.cloud.object_store import open_store
from raytrain.errors import SpecError
from raytrain.serve.jobs.admission import check_paths_on_head_node
from raytrain.spec import JobSpec
from raytrain.testing.s3_server import make_bucket, s3_server
from tests.support.hf_models import hf_job, make_folder, pretrained_reads

BUCKET = "s3://models/llama"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A tiny Llama, on disk and copied to the bucket."""
    local = make_folder("llama", tmp_path_factory.mktemp("hf") / "llama",
                        vocab_size=2048, hidden_size=128, intermediate_size=256)
    with s3_server() as endpoint:
        make_bucket(endpoint, "models")
        store = open_store(BUCKET)
        for path in sorted(local.iterdir()):
            store.put_file(path, path.name)
        yield local


def test_a_folder_in_a_bucket_is_read_at_submit_and_its_shapes_checked(folder: Path) -> None:
    spec = JobSpec.model_validate(hf_job(BUCKET))  # type: ignore[arg-type]
    assert spec.model.gpt.dim == 128 and spec.model.gpt.vocab_size == 2048
    check_paths_on_head_node(spec)  # every tensor's shape, from the headers
    with pytest.raises(SpecError, match="model.hf.path|hf"):
        JobSpec.model_validate(hf_job("s3://models/nowhere"))  # type: ignore[arg-type]


@pytest.mark.parametrize("strategy", ["fsdp", "tensor"])
def test_each_rank_fetches_only_the_rows_it_holds(folder: Path, tmp_path: Path,
                                                  strategy: str) -> None:
    """Two ranks load the same weights from the bucket as from the disk. Under FSDP each
    fetches its half of every tensor (at most 1.2 times its share of the folder's bytes: with
    each rank fetching every tensor whole it is 2); under tensor parallelism a row-wise
    weight's rows are fetched whole by both, the rest by halves."""
    reads, shares = _two_rank_reads(BUCKET, folder, strategy, tmp_path, strategy)
    assert all(r["same"] for r in reads)
    bound = 1.2 if strategy == "fsdp" else 2.0
    assert all(share <= bound for share in shares), shares


def _two_rank_reads(bucket: str, folder: Path, strategy: str, out: Path, title: str
                    ) -> tuple[list[dict[str, Any]], list[float]]:
    """Two ranks load the job's model from `bucket` and from `folder` on disk under
    `strategy`: what each fetched and found (pretrained_reads), and its bytes over its
    share of the folder's; printed under `title`."""
    import torch.multiprocessing as mp

    from raytrain.testing.runs import _free_port

    job = hf_job(bucket, parallel={"strategy": strategy},  # type: ignore[arg-type]
                 resources={"num_workers": 2})
    mp.spawn(pretrained_reads, args=(2, _free_port(), job, str(folder), str(out)), nprocs=2)
    reads = [json.loads((out / f"read-{rank}.json").read_text()) for rank in (0, 1)]
    total = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    shares = [r["bytes"] / (total / 2) for r in reads]
    print(f"\n{title} on 2 ranks, a {total:,}-byte folder: bytes fetched per rank "
          f"{reads[0]['bytes']:,} and {reads[1]['bytes']:,} ({shares[0]:.2f}x and "
          f"{shares[1]:.2f}x its share); load {reads[0]['bucket_s']:.2f} s from the bucket, "
          f"{reads[0]['disk_s']:.2f} s from disk (rank 0)")
    return reads, shares


@pytest.fixture(scope="module")
def moe_folder(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3-MoE (8 experts a block), on disk and in the bucket beside the Llama."""
    local = make_folder("qwen3_moe", tmp_path_factory.mktemp("hf") / "qwen3_moe",
                        num_experts=8, hidden_size=64, moe_intermediate_size=128,
                        vocab_size=512)
    store = open_store(MOE_BUCKET)
    for path in sorted(local.iterdir()):
        store.put_file(path, path.name)
    return local


MOE_BUCKET = "s3://models/qwen3-moe"


def test_each_rank_fetches_only_its_experts(moe_folder: Path, tmp_path: Path) -> None:
    """A mixture of experts from the bucket, on 2 ranks under expert parallelism: the same
    weights as from the disk, each rank fetching its half of the experts (its slice) and of
    the rest (FSDP's shards): at most 1.2 times its share of the folder (FSDP's shard of the
    experts reads the same rows: measured 1.01x too)."""
    reads, shares = _two_rank_reads(MOE_BUCKET, moe_folder, "expert", tmp_path,
                                    "Qwen3-MoE under expert parallelism")
    assert all(r["same"] for r in reads)
    assert all(share <= 1.2 for share in shares), shares
