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
from raytrain.testing.runs import run_single
from tests.support.corpus import CHATML, CHATS, TEXTS, chat_inputs, inputs, tokenizer_file


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


def test_documents_end_with_the_eos_token_of_a_tokenizer_saved_by_transformers(
        tmp_path: Path) -> None:
    """A tokenizer folder as transformers' save_pretrained writes it, whose eos_token
    ('[EOS]') is none of the usual names and comes after one of them ('<|endoftext|>'):
    documents end with the model's own eos_token (reading the list first fails it)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    plain = Tokenizer.from_file(str(tokenizer_file(tmp_path)))
    plain.add_special_tokens(["[EOS]"])
    folder = tmp_path / "model"
    PreTrainedTokenizerFast(tokenizer_object=plain, eos_token="[EOS]").save_pretrained(folder)
    assert main(["data", "prepare", *inputs(tmp_path)[:3], "--tokenizer", str(folder),
                 "--out", str(tmp_path / "out")]) == 0
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert index["eod_token"] == plain.token_to_id("[EOS]") != plain.token_to_id("<|endoftext|>")
    stream = np.fromfile(tmp_path / "out" / index["shards"][0]["file"], dtype=np.uint16)
    assert int(stream[-1]) == index["eod_token"]
    assert int((stream == index["eod_token"]).sum()) == index["documents"] == 42


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
    # A folder with no tokenizer.json, and one that is not a tokenizer: the fix, no traceback.
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "tokenizer.model").write_bytes(b"sentencepiece")
    assert main(["data", "prepare", inputs(tmp_path)[0], "--tokenizer", str(slow),
                 "--out", str(tmp_path / "out")]) == 2
    assert "tokenizer.model" in capsys.readouterr().err
    (slow / "tokenizer.json").write_text("{not json")
    assert main(["data", "prepare", inputs(tmp_path)[0], "--tokenizer", str(slow),
                 "--out", str(tmp_path / "out")]) == 2
    assert "To fix" in capsys.readouterr().err
    # A tokenizer_config.json beside a good tokenizer that is not JSON (read for its
    # eos_token): named, with the fix.
    good = tokenizer_file(slow)
    (slow / "tokenizer_config.json").write_text("{not json")
    assert main(["data", "prepare", inputs(tmp_path)[0], "--tokenizer", str(good),
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "tokenizer_config.json is not a JSON object" in err and "To fix" in err


def _trained_text(folder: Path, tokenizer: Path) -> list[str]:
    """Each example's trained tokens, decoded."""
    from tokenizers import Tokenizer

    source = TokenShards(str(folder), seq_len=16, vocab_size=None)
    stream = source.tokens(0, source.total)
    trained = source.spans.contains(np.arange(source.total))
    ends = np.flatnonzero(stream == json.loads((folder / "index.json").read_text())["eod_token"])
    decoder = Tokenizer.from_file(str(tokenizer))
    return [decoder.decode([int(t) for t, on in zip(stream[a:b + 1], trained[a:b + 1]) if on],
                           skip_special_tokens=False)
            for a, b in zip(np.concatenate([[0], ends[:-1] + 1]), ends)]


# ChatML with the system prompt folded into the first turn after it: a namespace, loop
# controls (`continue`, which transformers' environment has) and tojson's keywords.
FOLDED = ("{% set ns = namespace(system='') %}{% for m in messages %}"
          "{% if m['role'] == 'system' %}{% set ns.system = m['content'] %}{% continue %}"
          "{% endif %}{{ '<|im_start|>' + m['role'] + '\\n' }}{% if ns.system and "
          "loop.index0 == 1 %}{{ ns.system | tojson(ensure_ascii=False, indent=None) }}"
          "{{ '\\n' }}{% endif %}{{ m['content'] + '<|im_end|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
TEMPLATES = {"chatml": CHATML, "folded": FOLDED}


@pytest.mark.parametrize("template", ["chatml", "folded", None])
def test_chat_examples_train_on_the_assistants_turns_only(tmp_path: Path,
                                                          template: str | None) -> None:
    """With the tokenizer's chat template the trained tokens are each assistant turn and the
    template's closing of it, and every example's tokens are those of transformers'
    apply_chat_template; without one, the assistant's contents and the end of the
    example. Across shard boundaries, and the same bytes from the same input."""
    tokenizer, files = chat_inputs(tmp_path, TEMPLATES[template] if template else None)
    for out in ("a", "b"):
        assert main(["data", "prepare", *files, "--chat", "--tokenizer", str(tokenizer),
                     "--out", str(tmp_path / out), "--shard-tokens", "200"]) == 0
    index = json.loads((tmp_path / "a" / "index.json").read_text())
    assert index["masked"] and index["chat_template"] == bool(template)
    assert len(index["shards"]) > 2 and index["documents"] == len(CHATS)
    for name in sorted(p.name for p in (tmp_path / "a").iterdir()):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    close = "<|im_end|>\n" if template else ""
    expected = []
    for example in CHATS:
        turns = [m["content"] for m in example.get("messages", [])
                 if m["role"] == "assistant"] or [example["response"]]
        expected.append("".join(t + close for t in turns) + ("" if template
                                                            else "<|endoftext|>"))
    assert _trained_text(tmp_path / "a", tokenizer) == expected
    if template:
        from transformers import PreTrainedTokenizerFast

        from raytrain.data.chat import messages_of

        theirs = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer),
                                         chat_template=TEMPLATES[template])
        source = TokenShards(str(tmp_path / "a"), seq_len=16, vocab_size=None)
        stream = source.tokens(0, source.total).tolist()
        rendered = [theirs.apply_chat_template(messages_of(c, "-"), tokenize=True,
                                               return_dict=True)["input_ids"] for c in CHATS]
        assert stream == [t for ids in rendered for t in [*ids, index["eod_token"]]]


# ChatML whose earlier assistant turns are rendered shorter than the last (as Qwen3's
# template drops their reasoning), its trained text marked with {% generation %}.
MARKED = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
          "{% if message['role'] == 'assistant' %}{% generation %}{% if loop.last %}"
          "{{ message['content'] }}{% else %}{{ message['content'] | replace(', then rests', '') }}"
          "{% endif %}{{ '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}{% else %}"
          "{{ message['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def test_a_template_marking_its_trained_text_trains_what_transformers_masks(
        tmp_path: Path) -> None:
    """A template with {% generation %} marks: every example's tokens and trained flags are
    transformers' own `apply_chat_template(return_assistant_tokens_mask=True)` (its last
    token the end-of-document one, untrained). The template renders earlier turns apart from
    the last, so without its marks the examples are refused (checked below): the marks are
    what trains it."""
    from transformers import PreTrainedTokenizerFast

    from raytrain.data.chat import messages_of

    tokenizer, files = chat_inputs(tmp_path, MARKED)
    assert main(["data", "prepare", *files, "--tokenizer", str(tokenizer), "--chat",
                 "--out", str(tmp_path / "out")]) == 0
    source = TokenShards(str(tmp_path / "out"), seq_len=16, vocab_size=None)
    stream = source.tokens(0, source.total)
    trained = source.spans.contains(np.arange(source.total))
    eod = json.loads((tmp_path / "out" / "index.json").read_text())["eod_token"]
    ends = np.flatnonzero(stream == eod)
    theirs = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer), chat_template=MARKED)
    assert len(ends) == len(CHATS)
    for record, first, end in zip(CHATS, np.concatenate([[0], ends[:-1] + 1]), ends):
        masked = theirs.apply_chat_template(messages_of(record, "-"), tokenize=True,
                                            return_dict=True, return_assistant_tokens_mask=True)
        assert stream[first:end].tolist() == masked["input_ids"]
        assert trained[first:end].astype(int).tolist() == masked["assistant_masks"]
        assert 0 < sum(masked["assistant_masks"]) and not trained[end]
    unmarked = MARKED.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    (tmp_path / "unmarked").mkdir()
    tokenizer, files = chat_inputs(tmp_path / "unmarked", unmarked)
    assert main(["data", "prepare", *files, "--tokenizer", str(tokenizer), "--chat",
                 "--out", str(tmp_path / "refused")]) == 2


def test_a_bad_chat_example_is_refused_with_the_fix(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    tokenizer, _ = chat_inputs(tmp_path, CHATML)
    for record, says in (({"text": "x"}, "`messages`"),
                         ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant")):
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps(record) + "\n")
        assert main(["data", "prepare", str(bad), "--chat", "--tokenizer", str(tokenizer),
                     "--out", str(tmp_path / "out")]) == 2
        assert says in capsys.readouterr().err
    text = tmp_path / "a.txt"
    text.write_text("plain")
    assert main(["data", "prepare", str(text), "--chat", "--tokenizer", str(tokenizer),
                 "--out", str(tmp_path / "out")]) == 2
    assert "JSONL" in capsys.readouterr().err


# The mark begins inside a word: 'A: th' + marked 'en: ...', whose token 'Ġthen' (' then')
# begins before the mark; transformers trains it.
INSIDE = ("{% for m in messages %}{% if m['role'] == 'assistant' %}{{ 'A: th' }}"
          "{% generation %}{{ 'en: ' + m['content'] + '<|im_end|>' }}{% endgeneration %}"
          "{{ '\\n' }}{% else %}"
          "{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endif %}{% endfor %}")


@pytest.mark.parametrize("case", ["saved", "named", "inside_a_token"])
def test_a_tokenizer_saved_by_transformers_gives_its_tokens_and_masks(
        tmp_path: Path, case: str, capsys: pytest.CaptureFixture) -> None:
    """A tokenizer folder as transformers 5's save_pretrained writes it: the template in
    chat_template.jinja (none in tokenizer_config.json), named ones in
    additional_chat_templates/ (picked with --chat-template; several with no default are
    refused, naming them). Every example's tokens and trained flags are those of
    AutoTokenizer.from_pretrained(folder).apply_chat_template(return_assistant_tokens_mask=
    True), a mark that starts inside a token included (reading only tokenizer_config.json
    packed plain messages; a token trained only from where it starts missed ' 3')."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from raytrain.data.chat import messages_of

    folder = tmp_path / "tokenizer"
    folder.mkdir()
    templates: dict[str, str] | str = {"marked": MARKED, "inside": INSIDE} \
        if case == "named" else INSIDE if case == "inside_a_token" else MARKED
    PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file(tmp_path)), eos_token="<|endoftext|>",
                            chat_template=templates).save_pretrained(folder)
    assert not json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template")
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps(c) + "\n" for c in CHATS))
    command = ["data", "prepare", str(chats), "--chat", "--tokenizer", str(folder),
               "--out", str(tmp_path / "out")]
    name = None
    if case == "named":
        assert main(command) == 2  # no default: which one?
        err = capsys.readouterr().err
        assert "--chat-template" in err and "inside" in err and "marked" in err
        name = "inside"
        command += ["--chat-template", name]
    assert main(command) == 0
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert index["chat_template"]
    source = TokenShards(str(tmp_path / "out"), seq_len=16, vocab_size=None)
    stream = source.tokens(0, source.total)
    trained = source.spans.contains(np.arange(source.total))
    ends = np.flatnonzero(stream == index["eod_token"])
    theirs = AutoTokenizer.from_pretrained(folder)
    for record, first, end in zip(CHATS, np.concatenate([[0], ends[:-1] + 1]), ends):
        masked = theirs.apply_chat_template(messages_of(record, "-"), tokenize=True,
                                            return_dict=True, chat_template=name,
                                            return_assistant_tokens_mask=True)
        assert stream[first:end].tolist() == masked["input_ids"]
        assert trained[first:end].astype(int).tolist() == masked["assistant_masks"]


def test_each_bad_line_is_named_and_skip_bad_leaves_it_out(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A line that is not JSON, a misspelt role and a turn that is no string are refused
    naming the file, the line and the field; --skip-bad leaves them out, trains the rest and
    counts them. The summary names the shards' absolute path (a job's data.path; the service
    resolves a relative one against its own folder)."""
    tokenizer, _ = chat_inputs(tmp_path, CHATML)
    good = json.dumps(CHATS[0])
    lines = {2: '{"messages": [{"role": "user", "content": "hi"} {"role"',
             3: json.dumps({"messages": [{"role": "user", "content": "hi"},
                                         {"role": "assitant", "content": "hello"}]}),
             4: json.dumps({"messages": [{"role": "user", "content": 3}]})}
    says = {2: "is not JSON (Expecting ',' delimiter at column",
            3: "messages[1].role is 'assitant'; did you mean 'assistant'?",
            4: "messages[0].content is not a string"}
    bad = tmp_path / "bad.jsonl"
    for number, line in lines.items():
        bad.write_text("\n".join([good] * (number - 1) + [line, good]) + "\n")
        assert main(["data", "prepare", str(bad), "--chat", "--tokenizer", str(tokenizer),
                     "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert f"bad.jsonl:{number}" in err and says[number] in err and "--skip-bad" in err
    bad.write_text("\n".join([good, *lines.values(), good]) + "\n")
    monkey = tmp_path / "here"
    monkey.mkdir()
    monkeypatch.chdir(monkey)
    assert main(["data", "prepare", str(bad), "--chat", "--tokenizer", str(tokenizer),
                 "--out", "relative", "--skip-bad"]) == 0
    printed = capsys.readouterr()
    index = json.loads((monkey / "relative" / "index.json").read_text())
    assert index["documents"] == 2 and index["skipped"] == 3
    assert "skipped 3 bad examples" in printed.err and "bad.jsonl:2" in printed.err
    assert f"data.path {monkey / 'relative'}" in printed.out.replace("\n", "")
