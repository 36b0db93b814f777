"""A Hugging Face model at every layout: a pretrained folder of each Llama-family architecture
(Llama, Llama 3.x with tied embeddings, Mistral, Qwen2, Qwen3) trained on 2 gloo
ranks under data, FSDP, tensor and pipeline parallelism, each rank loading only its slices
(DCP's Hugging Face reader), takes every step with one process's loss to 1e-5, starting from
the pretrained model's; and a folder exported from FSDP and from the pipeline's stages loads
with `from_pretrained` and gives the one process's logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from raytrain.models.hf import load_pretrained
from raytrain.models.registry import build_model
from raytrain.spec import JobSpec
from raytrain.testing.parity import _losses, _spawn
from raytrain.testing.runs import run_single
from tests.support.hf_models import hf_job, hf_logits, make_folder
from tests.support.tolerances import LOGITS, SUM_ORDER

# Every family: Llama 3.x's rotary scaling and tied embeddings, Mistral, Qwen2's q/k/v biases,
# Qwen3's q/k norms and heads of their own width.
FAMILIES = ("llama", "llama3_tied", "mistral", "qwen2", "qwen3")
LAYOUTS = {"dp2": {"strategy": "data"}, "fsdp2": {"strategy": "fsdp"},
           "tp2": {"strategy": "tensor"}, "pp2": {"strategy": "pipeline"}}
# Tied embeddings are refused under a pipeline (the first and last stages would share them).
CASES = [(family, layout) for family in FAMILIES for layout in sorted(LAYOUTS)
         if not (family == "llama3_tied" and layout == "pp2")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, JobSpec]]:
    root = tmp_path_factory.mktemp("hf_layouts")
    folders = {family: make_folder(family, root / family) for family in FAMILIES}
    cases, specs = [], {}
    for family, folder in folders.items():
        specs[family] = JobSpec.model_validate(hf_job(folder, steps=4))
        for name, parallel in LAYOUTS.items():
            if (family, name) not in CASES:
                continue
            document = hf_job(folder, steps=4, parallel=parallel,
                              resources={"num_workers": 2})
            cases.append((f"{family}_{name}", document, {}))
    _spawn(2, cases, root / "runs")
    return root, specs


@pytest.mark.parametrize(("family", "layout"), CASES)
def test_every_layout_trains_a_pretrained_model_as_one_process(
        runs: tuple[Path, dict[str, JobSpec]], family: str, layout: str) -> None:
    root, specs = runs
    expected = run_single(specs[family], root / f"single_{family}_{layout}").losses()
    losses = _losses(root / "runs" / f"{family}_{layout}" / "losses.json")
    assert sorted(losses) == sorted(expected)
    for step, loss in expected.items():
        assert losses[step] == pytest.approx(loss, abs=SUM_ORDER), step


@pytest.mark.parametrize("layout", ["fsdp2", "pp2"])
def test_a_folder_exported_from_shards_or_stages_loads_in_transformers(
        runs: tuple[Path, dict[str, JobSpec]], layout: str) -> None:
    """Written by every rank (FSDP's shards, the pipeline's two stages), consolidated."""
    root, specs = runs
    exported = root / "runs" / f"llama_{layout}" / "hf"
    single = root / f"single_export_{layout}"
    run_single(specs["llama"], single)
    reference = build_model(specs["llama"].model)
    load_pretrained([reference], str(single / "hf"), False)
    tokens = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = reference.eval()(tokens)
    assert torch.allclose(hf_logits(exported, tokens), ours, atol=LOGITS, rtol=0)



@pytest.mark.parametrize(("family", "layout"), [
    ("llama", "fsdp2"), ("llama", "pp2"),
    ("llama3_tied", "dp2"), ("llama3_tied", "fsdp2"), ("llama3_tied", "tp2")])
def test_an_export_of_a_sharded_or_staged_checkpoint_is_the_jobs_own_folder(
        runs: tuple[Path, dict[str, JobSpec]], family: str, layout: str,
        tmp_path: Path) -> None:
    """The last checkpoint of a run trained with FSDP's shards or the pipeline's stages,
    exported in this one process (raytrain.train.export, what `raytrain export` runs), is
    the folder the job wrote at its end, tensor for tensor, and transformers loads it with
    its logits. Tied embeddings too (Llama 3.2's): the checkpoint holds the head under its
    own name, which an export reading only the model's distinct parameters missed."""
    from safetensors.torch import load_file

    from raytrain.train.checkpoint import latest_checkpoint
    from raytrain.train.export import export_checkpoint

    root, specs = runs
    run = root / "runs" / f"{family}_{layout}"
    checkpoint = latest_checkpoint(run)
    assert checkpoint is not None
    exported = export_checkpoint(specs[family], str(checkpoint), tmp_path / "exported")

    def tensors(folder: Path) -> dict[str, torch.Tensor]:
        found: dict[str, torch.Tensor] = {}
        for shard in sorted(folder.glob("*.safetensors")):
            found.update(load_file(shard))
        return found

    mine, theirs = tensors(exported), tensors(run / "hf")
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    tokens = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(3))
    assert torch.equal(hf_logits(exported, tokens), hf_logits(run / "hf", tokens))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_lora_under_data_parallelism_and_fsdp_trains_as_one_process(
        tmp_path: Path, precision: str) -> None:
    """Adapters on a pretrained Llama, every other weight frozen (kept in bf16 under 'bf16',
    beside fp32 adapters in the same FSDP units): 2 ranks under data parallelism and FSDP take
    every step with one process's loss (1e-5 in fp32; bf16's rounding, 2e-3)."""
    folder = make_folder("llama", tmp_path / "llama")

    def lora(**sections: object) -> dict:
        document = hf_job(folder, steps=4, **sections)
        document["training"] = {**document["training"], "precision": precision,
                                "lora": {"rank": 4, "alpha": 8.0}}
        return document

    cases = [(name, lora(parallel={"strategy": strategy}, resources={"num_workers": 2}), {})
             for name, strategy in (("dp2", "data"), ("fsdp2", "fsdp"))]
    _spawn(2, cases, tmp_path / "runs")
    expected = run_single(JobSpec.model_validate(lora()), tmp_path / "single").losses()
    tolerance = 1e-5 if precision == "fp32" else 2e-3
    for name, _, _ in cases:
        losses = _losses(tmp_path / "runs" / name / "losses.json")
        assert sorted(losses) == sorted(expected)
        for step, loss in expected.items():
            assert losses[step] == pytest.approx(loss, abs=tolerance), (name, step)
