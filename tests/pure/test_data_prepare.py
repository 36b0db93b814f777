"""`raytrain data prepare` with a tokenizer built in the test (tokenizers' BPE trainer, no
network): shards that decode back to the input documents, the same bytes from the same input,
and a job that trains on the shards, reading windows across shard boundaries as one stream."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from raytrain.cli.parser import main
from raytrain.data.shards import TokenShards
from raytrain.spec import JobSpec
from tests.support.corpus import TEXTS, inputs, tokenizer_file
from tests.support.runs import run_single


def test_shards_decode_back_to_the_documents_and_the_same_input_gives_the_same_bytes(
        tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = tokenizer_file(tmp_path)
    files = inputs(tmp_path)
    for out in ("a", "b"):
        assert main(["data", "prepare", *files, "--tokenizer", str(tokenizer),
                     "--out", str(tmp_path / out), "--shard-tokens", "500"]) == 0
    index = json.loads((tmp_path / "a" / "index.json").read_text())
    assert index["dtype"] == "uint16" and len(index["shards"]) > 1 and index["documents"] == 61
    stream = np.concatenate([np.fromfile(tmp_path / "a" / s["file"], dtype=np.uint16)
                             for s in index["shards"]])
    assert len(stream) == index["tokens"]
    eod = index["eod_token"]
    ends = np.flatnonzero(stream == eod)
    pieces = np.split(stream, ends + 1)[:-1]
    decoder = Tokenizer.from_file(str(tokenizer))
    assert [decoder.decode([int(t) for t in p[:-1]]) for p in pieces] == TEXTS
    for shard in index["shards"]:
        assert (tmp_path / "a" / shard["file"]).read_bytes() == \
            (tmp_path / "b" / shard["file"]).read_bytes()
    assert (tmp_path / "a" / "index.json").read_text() == \
        (tmp_path / "b" / "index.json").read_text()


def test_a_job_trains_on_shards_read_as_one_stream(tmp_path: Path) -> None:
    """Windows are cut from the shards' concatenation (one crosses a boundary); a job with
    data.path the folder trains and its loss falls."""
    tokenizer = tokenizer_file(tmp_path)
    assert main(["data", "prepare", *inputs(tmp_path), "--tokenizer", str(tokenizer),
                 "--out", str(tmp_path / "shards"), "--shard-tokens", "300"]) == 0
    source = TokenShards(str(tmp_path / "shards"), seq_len=16, vocab_size=300)
    whole = np.concatenate([np.asarray(s, dtype=np.int64) for s in source.shards])
    for index in range(source.num_windows):
        assert torch.equal(source.batch([index])[0],
                           torch.from_numpy(whole[index * 16:index * 16 + 17]))
    spec = JobSpec.model_validate({
        "model": {"gpt": {"vocab_size": 300, "dim": 32, "num_layers": 2, "num_heads": 4,
                          "max_seq_len": 16}},
        "data": {"kind": "token_file", "path": str(tmp_path / "shards"), "seq_len": 16},
        "training": {"steps": 30, "global_batch_size": 8, "micro_batch_size": 4,
                     "learning_rate": 0.01},
        "resources": {"num_workers": 1}})
    losses = run_single(spec, tmp_path / "run").losses()
    assert losses[30] < 0.7 * losses[1]


def test_a_bad_input_is_refused_with_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture
                                             ) -> None:
    tokenizer = tokenizer_file(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"body": "x"}) + "\n")
    assert main(["data", "prepare", str(bad), "--tokenizer", str(tokenizer),
                 "--out", str(tmp_path / "out")]) == 2
    assert "--field" in capsys.readouterr().err
    assert main(["data", "prepare", inputs(tmp_path)[0], "--tokenizer",
                 str(tokenizer), "--out", str(tmp_path / "out"), "--eod", "<nope>"]) == 2
    assert "--eod" in capsys.readouterr().err
