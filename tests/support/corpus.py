"""A tiny corpus and a tokenizer trained on it in the test (tokenizers' BPE trainer, no
network), for `raytrain data prepare`."""

from __future__ import annotations

import json
from pathlib import Path

TEXTS = [f"Document {n}: the quick brown fox jumps over the lazy dog {n} times, then rests."
         for n in range(60)] + ["Ünïcödé, emoji 🦊 and\nnew lines\ttabs."]


def tokenizer_file(folder: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(TEXTS, trainer)
    path = folder / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def inputs(folder: Path) -> list[str]:
    jsonl = folder / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t, "id": i}) + "\n"
                             for i, t in enumerate(TEXTS[:40])))
    texts = []
    for n, text in enumerate(TEXTS[40:]):
        path = folder / f"doc-{n:02d}.txt"
        path.write_text(text, encoding="utf-8")
        texts.append(str(path))
    return [str(jsonl), *texts]
