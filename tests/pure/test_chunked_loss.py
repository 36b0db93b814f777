"""The built-in model's loss a chunk of tokens at a time: the same value and gradients as the
whole logits' cross-entropy, and the logits never saved whole for the backward."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from raytrain.models.gpt import GPT
from raytrain.spec import GPTConfig

CONFIG = GPTConfig(vocab_size=512, dim=32, num_layers=2, num_heads=4, max_seq_len=64,
                   mlp="swiglu", positions="rotary", tie_embeddings=True)


def saved_bytes(fn) -> tuple[torch.Tensor, int]:
    """fn()'s result and the bytes autograd saved for its backward: each storage once (a
    chunk's slice of the hidden states and the head's weight, saved by every chunk, are
    views of storages that exist anyway)."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(storages.values())


def test_the_chunked_loss_is_the_whole_logits_loss_with_the_logits_never_saved_whole() -> None:
    """With chunks of 7 tokens (64 x 4 tokens: 37 chunks, the last short), loss and every
    gradient equal the whole logits' cross-entropy to 1e-6, and what autograd keeps for the
    backward is smaller by more than the fp32 logits (4 x 64 x 512 x 4 bytes). Keeping the
    chunks' logits (no recomputation) fails the bytes."""
    tokens = torch.randint(512, (4, 65), generator=torch.Generator().manual_seed(0))
    whole, chunked = GPT(CONFIG, seed=1), GPT(CONFIG, seed=1)
    chunked.loss_chunk_tokens = 7
    reference, whole_saved = saved_bytes(lambda: F.cross_entropy(
        whole(tokens[:, :-1]).flatten(0, 1).float(), tokens[:, 1:].flatten()))
    loss, chunk_saved = saved_bytes(lambda: chunked(tokens[:, :-1], targets=tokens[:, 1:]))
    # the same sum over tokens, taken in chunks of 7: a few ulps of a loss near 4
    assert torch.allclose(loss, reference, atol=1e-6, rtol=0)
    reference.backward()
    loss.backward()
    for (name, a), (_, b) in zip(whole.named_parameters(), chunked.named_parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6, rtol=0), name
    logits_bytes = 4 * 64 * 512 * 4
    assert whole_saved - chunk_saved > logits_bytes, (whole_saved, chunk_saved)
