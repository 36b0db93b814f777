"""Every bad input gets a clear error naming the field; good input gets safe defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raytrain.core.resolve import job_layout, plan_summary, predicted
from raytrain.core.schedule import peak_learning_rate
from raytrain.errors import SpecError
from raytrain.spec import JobSpec, check_imports_allowed, load_job_spec, parse_job_spec

ROOT = Path(__file__).resolve().parents[2]


def paths_of(exc: SpecError) -> list[str]:
    return [error.path for error in exc.errors]


def test_defaults_are_a_valid_small_cpu_job() -> None:
    spec = JobSpec()
    assert spec.resources.num_workers == 2 and not spec.resources.use_gpu
    layout = spec.stated_layout()
    assert layout.dp == 2
    assert layout.microbatches == 2  # 16 / (4 x 2)


def test_shipped_examples_parse() -> None:
    assert load_job_spec(ROOT / "examples" / "demo.yaml").name == "demo"
    assert load_job_spec(ROOT / "examples" / "job.json").name == "curl-job"
    hybrid = load_job_spec(ROOT / "examples" / "hybrid.yaml")
    assert hybrid.stated_layout().describe() == "tp2 pp2 1f1b mb4x4 sequence parallel"
    llama = load_job_spec(ROOT / "examples" / "llama-style.yaml")
    assert (llama.model.gpt.mlp, llama.model.gpt.kv_heads, llama.parallel.recompute_mode) == \
        ("swiglu", 2, "selective")


@pytest.mark.parametrize(
    ("document", "path", "words"),
    [
        ({"training": {"stepz": 10}}, "training.stepz", "Extra inputs"),
        ({"colour": "red"}, "colour", "Extra inputs"),
        ({"training": {"steps": "many"}}, "training.steps", "integer"),
        ({"training": {"steps": -5}}, "training.steps", "greater than or equal to 1"),
        ({"training": {"learning_rate": 0}}, "training.learning_rate", "greater than 0"),
        ({"resources": {"num_workers": 0}}, "resources.num_workers", "greater than or equal"),
        (
            {"parallel": {"dp_replicate": 3}, "resources": {"num_workers": 2}},
            "parallel.dp_replicate",
            "multiply to 3 but resources.num_workers=2",
        ),
        (
            {"training": {"global_batch_size": 10, "micro_batch_size": 4}},
            "training.global_batch_size",
            "multiple of",
        ),
        ({"data": {"seq_len": 500}}, "data.seq_len", "max_seq_len"),
        ({"model": {"gpt": {"dim": 100, "num_heads": 3}}}, "model.gpt.num_heads", "must divide"),
        ({"model": {"kind": "import"}}, "model.factory", "needs a factory"),
        ({"model": {"kind": "import", "factory": "not a path"}}, "model.factory", "import path"),
        ({"data": {"kind": "token_file"}}, "data.path", "needs a path"),
        ({"training": {"warmup_steps": 50, "steps": 10}}, "training.warmup_steps", "exceeds"),
        ({"name": "bad name!"}, "name", "pattern"),
        # true/false is never read as a number (pydantic's lax mode would take it as 1 or 0)
        ({"training": {"warmup_steps": False}}, "training.warmup_steps", "true/false"),
        ({"training": {"betas": [True, 0.95]}}, "training.betas", "To fix"),
        # Impossible layouts, each rejected at the field to change, with what would fit.
        ({"parallel": {"strategy": "hybrid", "tp": 2}, "resources": {"num_workers": 4}},
         "parallel.tp", "multiply to 2 but resources.num_workers=4"),
        ({"parallel": {"strategy": "fsdp", "tp": 3}, "resources": {"num_workers": 4}},
         "parallel.tp", "does not divide resources.num_workers=4"),
        ({"parallel": {"strategy": "tensor"}, "resources": {"num_workers": 3}},
         "parallel.tp", "use a tp that divides them and the worker count ([1])"),
        ({"parallel": {"strategy": "pipeline"}, "resources": {"num_workers": 8}},
         "parallel.pp", "use at most 4 stages"),
        ({"parallel": {"strategy": "pipeline", "virtual_stages": 2},
          "model": {"gpt": {"num_layers": 4}}}, "parallel.virtual_stages", "interleaved_1f1b"),
        ({"parallel": {"strategy": "pipeline", "pipeline_schedule": "interleaved_1f1b"}},
         "parallel.virtual_stages", "at least 2 stages per pipeline rank"),
        ({"parallel": {"strategy": "pipeline"}, "training": {"global_batch_size": 4}},
         "training.global_batch_size", "needs at least 2 microbatches"),
        ({"parallel": {"strategy": "tensor"}, "data": {"seq_len": 63}},
         "parallel.sequence_parallel", "multiple of 2"),
        ({"parallel": {"strategy": "fsdp", "compression": "powersgd"}},
         "parallel.compression", "uses FSDP2"),
        ({"parallel": {"strategy": "data", "reduce_scatter_once": True}},
         "parallel.reduce_scatter_once", "has none to hold back"),
        ({"parallel": {"strategy": "pipeline", "dp_shard": 2, "reduce_scatter_once": True},
          "resources": {"num_workers": 4}},
         "parallel.reduce_scatter_once", "a pipeline reduces once per step"),
        ({"parallel": {"strategy": "data", "zero2": True}},
         "parallel.zero2", "does not shard them (dp_shard is 1)"),
        ({"parallel": {"strategy": "pipeline", "dp_shard": 2, "zero2": True},
          "resources": {"num_workers": 4}},
         "parallel.zero2", "a pipeline does not reshard between micro-batches"),
        ({"parallel": {"strategy": "tensor"}, "model": {"kind": "import", "factory": "a.b:c"}},
         "parallel.tp", "needs the built-in GPT"),
        ({"training": {"precision": "fp16"}}, "training.precision", "needs GPUs"),
        ({"training": {"lr_scaling": "sqrt"}}, "training.lr_reference_batch_size", "tuned for"),
        ({"parallel": {"strategy": "auto"}, "resources": {"gpus_per_worker": 1}},
         "resources.accelerator", "strategy 'auto' plans for a GPU kind"),
        ({"resources": {"accelerator": "tpu-v9"}}, "resources.accelerator", "use one of"),
        # Llama-style options and the ways of reducing and recomputing
        ({"model": {"gpt": {"num_heads": 4, "num_kv_heads": 3}}}, "model.gpt.num_kv_heads",
         "must divide num_heads"),
        ({"model": {"gpt": {"dim": 12, "num_heads": 4, "positions": "rotary"}},
          "data": {"seq_len": 8}}, "model.gpt.positions", "odd number"),
        ({"parallel": {"strategy": "pipeline"}, "model": {"gpt": {"tie_embeddings": True}}},
         "parallel.pp", "tie_embeddings to false"),
        ({"parallel": {"compression": "powersgd", "grad_reduce_dtype": "bf16"}},
         "parallel.grad_reduce_dtype", "a job uses one"),
        ({"parallel": {"activation_checkpointing": True, "recompute": "selective"}},
         "parallel.recompute", "contradicts"),
        ({"model": {"gpt": {}, "shape": {"dim": 64}}}, "model.shape", "means nothing"),
    ],
)
def test_bad_input_names_the_field(document: dict, path: str, words: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_job_spec(document)
    assert path in paths_of(caught.value)
    assert words in str(caught.value)


def test_an_auto_job_nothing_fits_is_refused_at_the_strategy_when_resolved() -> None:
    spec = parse_job_spec({
        "parallel": {"strategy": "auto"},
        "training": {"global_batch_size": 8, "micro_batch_size": 1},
        "model": {"gpt": {"dim": 8192, "num_layers": 80, "num_heads": 64}},
        "resources": {"num_workers": 2, "gpus_per_worker": 1, "accelerator": "rtx4090"}})
    with pytest.raises(SpecError) as caught:
        plan_summary(spec)
    assert paths_of(caught.value) == ["parallel.strategy"]
    assert "To fix: use" in str(caught.value)


def test_cross_field_errors_say_how_to_fix() -> None:
    with pytest.raises(SpecError) as caught:
        parse_job_spec({"training": {"global_batch_size": 10, "micro_batch_size": 4}})
    assert "To fix: use 8" in str(caught.value)


def test_several_errors_are_reported_together() -> None:
    with pytest.raises(SpecError) as caught:
        parse_job_spec({"training": {"steps": -1, "seed": -1}, "typo": 1})
    assert {"training.steps", "training.seed", "typo"} <= set(paths_of(caught.value))


def test_import_path_outside_allowed_packages_is_refused() -> None:
    spec = parse_job_spec({"model": {"kind": "import", "factory": "os.path:join"}})
    with pytest.raises(SpecError) as caught:
        check_imports_allowed(spec, ["mylab"])
    assert paths_of(caught.value) == ["model.factory"]
    assert "allowed_import_packages" in str(caught.value)
    check_imports_allowed(spec, ["os"])  # allowed: no error
    spoof = parse_job_spec({"model": {"kind": "import", "factory": "mylabevil.x:f"}})
    with pytest.raises(SpecError):
        check_imports_allowed(spoof, ["mylab"])  # a prefix of the name is not the package


def test_files_missing_or_malformed_get_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load_job_spec(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(SpecError, match="not valid json"):
        load_job_spec(broken)
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="mapping"):
        load_job_spec(listing)


def test_spec_round_trips_through_json() -> None:
    spec = parse_job_spec({"name": "x", "training": {"steps": 7}})
    assert JobSpec.model_validate(json.loads(spec.model_dump_json())) == spec


@pytest.mark.parametrize(
    ("parallel", "workers", "degrees"),
    [
        ({"strategy": "data"}, 4, (4, 1, 1, 1)),
        ({"strategy": "fsdp"}, 4, (1, 4, 1, 1)),
        ({"strategy": "fsdp", "dp_replicate": 2}, 8, (2, 4, 1, 1)),
        ({"strategy": "fsdp", "tp": 2}, 8, (1, 4, 2, 1)),
        ({"strategy": "tensor"}, 2, (1, 1, 2, 1)),
        ({"strategy": "pipeline", "dp_replicate": 2}, 4, (2, 1, 1, 2)),
        ({"strategy": "hybrid", "pp": 2, "tp": 2}, 4, (1, 1, 2, 2)),
    ],
)
def test_strategy_fills_its_own_degree(parallel: dict, workers: int, degrees: tuple) -> None:
    spec = parse_job_spec({"parallel": parallel, "resources": {"num_workers": workers},
                           "training": {"global_batch_size": 32, "micro_batch_size": 2}})
    layout = spec.stated_layout()
    assert (layout.dp_replicate, layout.dp_shard, layout.tp, layout.pp) == degrees
    assert layout.world_size == workers
    assert layout.microbatches * layout.dp * 2 == 32


def test_lr_scaling_uses_the_reference_batch() -> None:
    spec = parse_job_spec({"training": {"global_batch_size": 64, "learning_rate": 0.001,
                                        "lr_scaling": "sqrt", "lr_reference_batch_size": 16}})
    assert peak_learning_rate(spec.training) == pytest.approx(0.002)


def test_auto_picks_a_valid_layout_and_predicts_it() -> None:
    spec = parse_job_spec({"parallel": {"strategy": "auto"}, "resources": {"num_workers": 4}})
    assert spec.stated_layout() is None  # validation does not plan: resolving does, once
    summary = plan_summary(spec)
    assert summary.layout.world_size == 4 and summary.description == summary.layout.describe()
    assert summary.predicted_step_s > 0 and summary.reason.startswith(summary.description)
    big = parse_job_spec({
        "parallel": {"strategy": "auto"},
        "model": {"gpt": {"vocab_size": 32000, "dim": 4096, "num_layers": 32, "num_heads": 32,
                          "max_seq_len": 4096}},
        "data": {"seq_len": 4096},
        "training": {"global_batch_size": 64, "micro_batch_size": 1, "precision": "bf16"},
        "resources": {"num_workers": 16, "gpus_per_worker": 1, "accelerator": "h100-sxm"},
    })
    layout = job_layout(big)
    assert layout.world_size == 16 and predicted(big, layout).fits


def test_plan_command_ranks_layouts_offline(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from raytrain.cli import main

    assert main(["plan", str(ROOT / "examples" / "demo.yaml"), "--gpus", "8", "--gpu",
                 "h100-sxm", "--price", "2.0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gpus"] == 8 and report["accelerator"] == "h100-sxm"
    times = [row["step_s"] for row in report["plans"]]
    assert times == sorted(times) and report["plans"][0]["usd_per_million_tokens"] > 0
    too_big = tmp_path / "big.yaml"
    too_big.write_text("model: {gpt: {dim: 8192, num_layers: 80, num_heads: 64}}\n"
                       "training: {global_batch_size: 8, micro_batch_size: 1}\n")
    assert main(["plan", str(too_big), "--gpus", "2", "--gpu", "rtx4090"]) == 1
    assert "To fix" in capsys.readouterr().err


def test_a_misspelt_choice_gets_the_word_meant() -> None:
    """One of a few words (a strategy, a precision): the closest is named."""
    from raytrain.errors import SpecError
    from raytrain.spec import parse_job_spec

    for section, field, typed, meant in (("parallel", "strategy", "fdsp", "'fsdp'"),
                                         ("training", "precision", "bf61", "'bf16'")):
        with pytest.raises(SpecError) as refused:
            parse_job_spec({section: {field: typed}})
        assert f"did you mean {meant}?" in str(refused.value)


def test_every_fine_tuning_example_trains_on_data_of_its_own() -> None:
    """A pretrained folder fine-tuned on synthetic tokens would teach a user nothing: each
    Hugging Face example reads token shards (`raytrain data prepare`)."""
    import yaml

    from raytrain.spec.files import EXAMPLES_DIR

    examples = sorted(EXAMPLES_DIR.glob("hf-*.yaml"))
    assert len(examples) >= 5
    for example in examples:
        data = yaml.safe_load(example.read_text())["data"]
        assert data.get("kind") == "token_file" and data.get("path"), example.name
