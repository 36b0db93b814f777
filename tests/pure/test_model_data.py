"""The built-in GPT and the token sources."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from raytrain.data.sources import SyntheticTokens, TokenFile, build_source
from raytrain.errors import SpecError
from raytrain.models.gpt import GPT, num_parameters
from raytrain.models.registry import build_model
from raytrain.spec import DataSpec, GPTConfig, ModelSpec


def test_gpt_maps_tokens_to_logits_and_is_causal() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, dim=32, num_layers=2, num_heads=4, max_seq_len=16))
    tokens = torch.randint(50, (3, 16))
    logits = model(tokens)
    assert logits.shape == (3, 16, 50)
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 50
    # Changing the last token must not change any earlier position's output.
    assert torch.allclose(model(changed)[:, :-1], logits[:, :-1])
    assert num_parameters(model) > 0
    assert set(model.layers.keys()) == {"0", "1"}


def test_synthetic_sample_depends_only_on_its_index() -> None:
    source = SyntheticTokens(vocab_size=64, seq_len=16, seed=3)
    together = source.batch([5, 6, 7])
    assert torch.equal(together[1], source.batch([6])[0])
    assert together.shape == (3, 17) and together.dtype == torch.int64
    assert not torch.equal(together[0], together[1])
    assert torch.equal(SyntheticTokens(64, 16, 3).batch([5]), source.batch([5]))
    # Learnable: most next tokens follow the chain.
    follows = (source.successor[together[:, :-1]] == together[:, 1:]).float().mean()
    assert follows > 0.8


def test_token_file_is_read_in_windows_and_wraps(tmp_path: Path) -> None:
    path = tmp_path / "tokens.bin"
    np.arange(100, dtype=np.uint16).tofile(path)
    source = TokenFile(str(path), "uint16", seq_len=10, vocab_size=1000)
    assert source.num_windows == 9
    batch = source.batch([0, 1, 9])
    assert batch[0].tolist() == list(range(0, 11))
    assert batch[1].tolist() == list(range(10, 21))
    assert torch.equal(batch[2], batch[0])  # window 9 wraps to 0


def test_token_file_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="data.path"):
        TokenFile(str(tmp_path / "missing.bin"), "uint16", 10, None)
    path = tmp_path / "big.bin"
    np.array([0, 70000, 1, 2], dtype=np.uint32).tofile(path)
    with pytest.raises(SpecError, match="vocab_size"):
        TokenFile(str(path), "uint32", 2, vocab_size=100).batch([0])


def test_user_model_and_dataset_by_import_path() -> None:
    model = build_model(
        ModelSpec(
            kind="import",
            factory="raytrain.testing.jobs:make_tiny_model",
            options={"dim": 8})
    )
    assert model(torch.zeros(2, 5, dtype=torch.int64)).shape == (2, 5, 50)
    source = build_source(
        DataSpec(kind="import", seq_len=8, factory="raytrain.testing.jobs:make_dataset",
                 options={"seq_len": 8}),
        vocab_size=None,
    )
    assert source.batch([2])[0].tolist() == [2, 3, 4, 5, 6, 7, 8, 9, 10]


def test_unimportable_factory_names_the_field() -> None:
    with pytest.raises(SpecError, match="model.factory"):
        build_model(ModelSpec(kind="import", factory="no_such_package_xyz.models:build"))
    with pytest.raises(SpecError, match="no attribute"):
        build_model(ModelSpec(kind="import", factory="raytrain.testing.jobs:missing"))
