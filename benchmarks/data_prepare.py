"""`raytrain data prepare` against `tokenizers`' own batch encoding of the same text, side by
side on this machine: a synthetic JSONL corpus, a BPE tokenizer trained on it here.

    python benchmarks/data_prepare.py [--documents 20000] [--words 200]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from raytrain.data.prepare import BATCH_DOCUMENTS, prepare


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--words", type=int, default=200)
    args = parser.parse_args()
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(5000)]
    texts = [" ".join(rng.choice(words) for _ in range(args.words))
             for _ in range(args.documents)]
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        corpus = root / "corpus.jsonl"
        corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.train_from_iterator(texts[:2000], trainers.BpeTrainer(
            vocab_size=8000, special_tokens=["<unk>", "<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tokenizer.save(str(root / "tokenizer.json"))
        began = time.perf_counter()
        for start in range(0, len(texts), BATCH_DOCUMENTS):
            tokenizer.encode_batch(texts[start:start + BATCH_DOCUMENTS],
                                   add_special_tokens=False)
        alone = time.perf_counter() - began
        began = time.perf_counter()
        index = prepare([str(corpus)], str(root / "tokenizer.json"), str(root / "out"))
        ours = time.perf_counter() - began
    print(f"{args.documents:,} documents, {index['tokens']:,} tokens: tokenizers' encode_batch "
          f"{alone:.2f} s, raytrain data prepare (read, encode, write) {ours:.2f} s: "
          f"{alone / ours:.2f}x its throughput")


if __name__ == "__main__":
    main()
