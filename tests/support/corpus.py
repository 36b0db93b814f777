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


# Fine-tuning examples: a chat of two assistant turns, and prompt / response pairs.
CHATS = [{"messages": [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": f"How many times, fox {n}?"},
                       {"role": "assistant", "content": f"{n} times, then rests."},
                       {"role": "user", "content": "And the dog?"},
                       {"role": "assistant", "content": "The lazy dog sleeps."}]}
         for n in range(12)] + [{"prompt": f"Document {n}: the quick", "response": " brown fox."}
                                for n in range(12)]

# ChatML, as Qwen's and others' tokenizer_config.json ship it.
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt "
          "%}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def chat_inputs(folder: Path, template: str | None) -> tuple[Path, list[str]]:
    """The tokenizer (with `template` in its tokenizer_config.json, if any) and the JSONL
    of CHATS."""
    tokenizer = tokenizer_file(folder)
    if template is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(
            {"chat_template": template, "eos_token": "<|endoftext|>"}))
    jsonl = folder / "chats.jsonl"
    jsonl.write_text("".join(json.dumps(c) + "\n" for c in CHATS))
    return tokenizer, [str(jsonl)]
