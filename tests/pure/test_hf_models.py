"""Hugging Face models in, trained as the built-in model, and Hugging Face folders out, in one
process: each family's logits equal transformers' forward, a job's first loss is the
pretrained model's, its exported folder loads with `from_pretrained` and gives raytrain's
logits, and what cannot be trained is refused at submit naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from raytrain.errors import SpecError
from raytrain.models.hf import load_pretrained
from raytrain.models.registry import build_model
from raytrain.serve.jobs.admission import check_paths_on_head_node
from raytrain.spec import JobSpec, parse_job_spec
from raytrain.testing.runs import run_single
from raytrain.train.checkpoint import latest_checkpoint
from tests.support.hf_models import FAMILIES, hf_job, hf_logits, make_folder
from tests.support.tolerances import LOGITS, SUM_ORDER


def raytrain_logits(spec: JobSpec, tokens: torch.Tensor) -> torch.Tensor:
    model = build_model(spec.model, seed=0)
    load_pretrained([model], spec.model.hf.path, spec.model.gpt.tie_embeddings)
    with torch.no_grad():
        return model.eval()(tokens)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_familys_logits_equal_transformers(family: str, tmp_path: Path) -> None:
    """Llama, Llama 3.x (rotary scaling, tied embeddings), Mistral and Qwen2 (q/k/v biases):
    the same logits as transformers' own forward, to 1e-5, over a sequence past the scaled
    rotary's original context. Without the rotary scaling, the norms' epsilon or the biases
    they differ (each checked once by removing it)."""
    folder = make_folder(family, tmp_path / family)
    spec = JobSpec.model_validate(hf_job(folder))
    tokens = torch.randint(64, (2, 40), generator=torch.Generator().manual_seed(1))
    ours, theirs = raytrain_logits(spec, tokens), hf_logits(folder, tokens)
    assert torch.allclose(ours, theirs, atol=LOGITS, rtol=0), (ours - theirs).abs().max()


def test_a_job_starts_from_the_pretrained_loss_and_exports_a_folder_transformers_loads(
        tmp_path: Path) -> None:
    """The first step's loss is the pretrained model's on that step's batch (from the
    synthetic source, as the loop reads it); after training, `hf/` beside the checkpoints
    loads with from_pretrained and gives the logits of raytrain's model at its last
    checkpoint."""
    folder = make_folder("qwen2", tmp_path / "qwen2")
    spec = JobSpec.model_validate(hf_job(folder, steps=3))
    from raytrain.core.batching import BatchPlan
    from raytrain.data.sources import build_source

    source = build_source(spec.data, spec.model.gpt.vocab_size)
    plan = BatchPlan(8, 2, 1)
    batches = [source.batch(plan.sample_range(0, unit, 0)) for unit in range(4)]
    pretrained = sum(F.cross_entropy(hf_logits(folder, b[:, :-1]).flatten(0, 1),
                                     b[:, 1:].flatten()) for b in batches) / 4
    sink = run_single(spec, tmp_path / "run")
    assert sink.losses()[1] == pytest.approx(float(pretrained), abs=SUM_ORDER)
    exported = tmp_path / "run" / "hf"
    assert (exported / "config.json").is_file()
    assert (exported / "model.safetensors.index.json").is_file()
    assert not (exported / "sharded").exists()
    trained = build_model(spec.model, seed=0)
    from raytrain.train.checkpoint import CheckpointManager

    checkpoint = latest_checkpoint(tmp_path / "run")
    assert checkpoint is not None and checkpoint.name.endswith("3")
    CheckpointManager(tmp_path / "run", 0).load(str(checkpoint), [trained], [
        torch.optim.AdamW(trained.parameters())])
    tokens = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours = trained.eval()(tokens)
    assert torch.allclose(ours, hf_logits(exported, tokens), atol=LOGITS, rtol=0)


@pytest.mark.parametrize("family,window", [
    ("mistral", {"sliding_window": 16}),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1})])
def test_a_sliding_window_trains_sequences_within_it_as_transformers_runs_them(
        family: str, window: dict, tmp_path: Path) -> None:
    """A window of 16 (Mistral's on every layer, Qwen2's on the layers past
    max_window_layers) over sequences of 16: transformers' windowed attention is full causal
    attention there, so the logits are the same to 1e-5; the model's positions are the
    window's, and a job of longer sequences is refused naming data.seq_len and the window."""
    folder = make_folder(family, tmp_path / family, **window)
    spec = JobSpec.model_validate(hf_job(folder))
    assert spec.model.gpt.max_seq_len == 16
    tokens = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(1))
    ours, theirs = raytrain_logits(spec, tokens), hf_logits(folder, tokens)
    assert torch.allclose(ours, theirs, atol=LOGITS, rtol=0), (ours - theirs).abs().max()
    with pytest.raises(SpecError, match=r"data.seq_len.*sliding_window.*at most 16"):
        parse_job_spec(hf_job(folder, data={"seq_len": 17}))


def test_what_cannot_be_trained_is_refused_at_submit_naming_the_field(tmp_path: Path) -> None:
    """An architecture outside the Llama family, a Mistral with a sliding window, a Qwen3
    whose layers attend over one, an unknown rotary scaling, a missing folder, and weights
    whose shapes differ from the config."""
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 32,
        "n_layer": 2, "n_head": 4, "vocab_size": 64}))
    sliding = make_folder("mistral", tmp_path / "sliding", sliding_window=8)
    yarn = tmp_path / "yarn"
    make_folder("llama", yarn)
    config = json.loads((yarn / "config.json").read_text())
    (yarn / "config.json").write_text(json.dumps({**config, "rope_parameters": {
        "rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}}))
    windowed = make_folder("qwen3", tmp_path / "windowed",
                           layer_types=["full_attention", "sliding_attention"])
    for folder, field in ((gpt2, "architectures"), (sliding, "sliding_window"),
                          (yarn, "rope_parameters"), (windowed, "layer_types"),
                          (tmp_path / "nowhere", "hf")):
        with pytest.raises(SpecError) as refused:
            parse_job_spec(hf_job(folder))
        assert field in str(refused.value) and "To fix" in str(refused.value), folder
        if field in ("architectures", "rope_parameters", "layer_types"):
            # what the folder's config holds: the job's field is the folder, named; the
            # config's own field is in the message
            assert [e.path for e in refused.value.errors] == ["model.hf.path"], folder
    with pytest.raises(SpecError) as refused:
        parse_job_spec(hf_job(gpt2))
    assert "model.factory" in str(refused.value) and "--allow-import" in str(refused.value)
    wrong = make_folder("llama", tmp_path / "wrong")
    config = json.loads((wrong / "config.json").read_text())
    (wrong / "config.json").write_text(json.dumps({**config, "intermediate_size": 40}))
    spec = JobSpec.model_validate(hf_job(wrong))  # the config alone is fine
    with pytest.raises(SpecError, match=r"mlp.gate_proj.weight is \[48, 32\].*\[40, 32\]"):
        check_paths_on_head_node(spec)


def test_an_export_is_in_the_sources_dtype_unless_asked_and_says_so(tmp_path: Path) -> None:
    """A source whose config.json says bfloat16 exports bfloat16 weights (as save_pretrained
    of a bf16 model writes; it wrote float32 under a config saying bfloat16), `dtype` another;
    config.json says what the weights are, and transformers loads both."""
    from safetensors import safe_open

    from raytrain.models.hf import export_folder

    folder = make_folder("llama", tmp_path / "llama")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    spec = JobSpec.model_validate(hf_job(folder))
    model = build_model(spec.model, seed=0)
    tokens = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(2))
    for asked, dtype, name in ((None, torch.bfloat16, "bfloat16"),
                               ("float32", torch.float32, "float32")):
        out = export_folder([model], str(folder), tmp_path / f"out-{name}", False, asked)
        assert json.loads((out / "config.json").read_text())["dtype"] == name
        for file in out.glob("*.safetensors"):
            with safe_open(str(file), framework="pt") as handle:
                assert {handle.get_tensor(k).dtype for k in handle.keys()} == {dtype}
        loaded = hf_logits(out, tokens)
        assert loaded.shape == (2, 16, 64) and torch.isfinite(loaded).all()


def test_the_folder_readers_follow_its_index_and_read_every_safetensors_dtype(
        tmp_path: Path) -> None:
    """With model.safetensors.index.json, a folder's weights are the files it lists (a
    stale shard beside them is not read; a listed file that is missing is refused naming
    model.hf.path); the bucket reader's headers know float8 and unsigned tensors, and name
    a dtype torch cannot read."""
    from safetensors.torch import save_file

    from raytrain.cloud.object_store import open_store
    from raytrain.models.hf import check_shapes
    from raytrain.models.hf_bucket import INDEX, header

    folder = make_folder("llama", tmp_path / "llama")
    spec = JobSpec.model_validate(hf_job(folder))
    model = build_model(spec.model, seed=0)
    [weights] = [p.name for p in folder.glob("*.safetensors")]
    save_file({"model.embed_tokens.weight": torch.zeros(3, 3)}, str(folder / "stale.safetensors"))
    with pytest.raises(SpecError):  # without an index every file is the model's
        check_shapes([model], str(folder), False)
    (folder / INDEX).write_text(json.dumps({"weight_map": {"x": weights}}))
    check_shapes([model], str(folder), False)
    (folder / INDEX).write_text(json.dumps({"weight_map": {"x": "model-00002.safetensors"}}))
    with pytest.raises(SpecError) as refused:
        check_shapes([model], str(folder), False)
    assert "model-00002.safetensors" in str(refused.value)
    assert [e.path for e in refused.value.errors] == ["model.hf.path"]
    odd = tmp_path / "odd"
    odd.mkdir()
    save_file({"a": torch.zeros(2, dtype=torch.float8_e4m3fn),
               "b": torch.zeros(2, dtype=torch.uint16)}, str(odd / "w.safetensors"))
    found = header(open_store(str(odd)), "w.safetensors")
    assert (found["a"][0], found["b"][0]) == (torch.float8_e4m3fn, torch.uint16)
