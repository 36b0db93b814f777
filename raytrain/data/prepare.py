"""`raytrain data prepare`: text, JSONL or Parquet tokenized with a model's own tokenizer
(`tokenizer.json`, through Hugging Face's `tokenizers`, no network) into token shards with an
index (raytrain.data.shards reads them), an end-of-document token after each document.

Deterministic: documents in the order given (files in the order named, lines and rows in
file order), encoded in batches by `tokenizers`' Rust encoder; the same input and tokenizer
give the same bytes. uint16 when the vocabulary fits, else uint32.

With `chat=True` the inputs are JSONL fine-tuning examples (raytrain.data.chat): each shard
gets a `.spans` file beside it, the [start, end) token ranges (int64 pairs, from the shard's
start) whose loss is taken, and the index says `"masked": true`. Examples follow each other
in the shards (packed), each ended by the end-of-document token.

`out` may be a bucket's prefix (s3://BUCKET/PREFIX; the storage settings of the environment,
AWS_ENDPOINT_URL_S3 and the credentials): each shard is written to a local temporary folder,
put in the bucket once complete and deleted here (one shard's disk at a time), and the index
is put last, so a reader never finds an index whose shards are not all there.

    index = prepare(["corpus.jsonl"], "tokenizer.json", "out/", field="text")
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import chain
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import numpy as np

from raytrain.cloud.object_store import is_remote, open_store
from raytrain.data.chat import ChatEncoder, ChatError, messages_of, spans_of, special_tokens
from raytrain.data.shards import INDEX, SPANS_DTYPE

T = TypeVar("T")

END_OF_DOCUMENT = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>")
BATCH_DOCUMENTS = 256


class PrepareError(Exception):
    """A bad input or option, with the fix."""


class Skipped:
    """The bad lines a prepare with --skip-bad left out: how many, and the first refusals."""

    KEEP = 20

    def __init__(self, skip: bool) -> None:
        self.skip, self.count, self.first = skip, 0, []

    def refuse(self, why: str) -> None:
        """Skip the line `why` refuses, or end the prepare with it."""
        if not self.skip:
            raise PrepareError(why + " (or pass --skip-bad to leave such lines out)")
        self.count += 1
        if len(self.first) < self.KEEP:
            self.first.append(why)

    def index(self) -> dict[str, Any]:
        return {"skipped": self.count, "skipped_first": self.first} if self.count else {}


def json_line(line: str, where: str) -> Any:
    """One JSONL line's value; ChatError naming its file, line and column if it is not
    JSON."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise ChatError(f"{where} is not JSON ({exc.msg} at column {exc.colno}). To fix: "
                        "mend the line, one JSON object a line") from None


def documents(path: Path, field: str, column: str, skipped: Skipped | None = None
              ) -> Iterator[str]:
    """The documents of one input: a .jsonl's lines' `field`, a .parquet's `column`, a text
    file whole. A bad line is refused, or left out and counted (`skipped`)."""
    skipped = skipped or Skipped(False)
    if path.suffix == ".jsonl":
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    where = f"{path}:{number}"
                    try:
                        record = json_line(line, where)
                    except ChatError as exc:
                        skipped.refuse(str(exc))
                        continue
                    if not isinstance(record, dict) or not isinstance(record.get(field), str):
                        skipped.refuse(f"{where} has no text field {field!r}. To fix: name "
                                       "the field with --field")
                        continue
                    yield record[field]
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.ParquetFile(path)
        if column not in table.schema_arrow.names:
            raise PrepareError(f"{path} has no column {column!r} (it has "
                               f"{', '.join(table.schema_arrow.names)}). To fix: --column")
        for batch in table.iter_batches(columns=[column]):
            yield from (str(text) for text in batch.column(0).to_pylist() if text)
    else:
        yield path.read_text(encoding="utf-8")


def end_of_document(tokenizer: Any, named: str | None, eos_token: str | None = None) -> int:
    """The id written after each document: `named`, else the model's own end-of-sequence
    token (`eos_token`, from the tokenizer_config.json beside the tokenizer: what the model
    was trained to end a text with), else the first of END_OF_DOCUMENT the tokenizer
    knows."""
    candidates = [named] if named else [*([eos_token] if eos_token else []), *END_OF_DOCUMENT]
    for token in candidates:
        found = tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
    raise PrepareError(f"the tokenizer has none of {candidates} as a token. "
                       "To fix: name its end-of-document token with --eod")


def prepare(inputs: list[str], tokenizer_path: str, out: str, field: str = "text",
            column: str = "text", eod: str | None = None, shard_tokens: int = 100_000_000,
            progress: Callable[[int, int], None] | None = None, chat: bool = False,
            chat_template: str | None = None, skip_bad: bool = False) -> dict[str, Any]:
    """Tokenize `inputs` into shards under `out`; the index written (module doc).
    `progress(documents, tokens)` is called after each batch. `chat_template`: the named
    template to render with; `skip_bad`: leave out the lines that cannot be read (counted in
    the index's `skipped`) where the first ends the prepare."""
    from tokenizers import Tokenizer

    paths = [Path(p).expanduser() for p in inputs]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise PrepareError(f"no such input: {', '.join(missing)}")
    if chat and any(p.suffix != ".jsonl" for p in paths):
        raise PrepareError("--chat reads JSONL examples (messages, or prompt and response); "
                           f"not {', '.join(str(p) for p in paths if p.suffix != '.jsonl')}")
    tokenizer_file = Path(tokenizer_path).expanduser()
    if not tokenizer_file.is_file():
        beside = sorted(p.name for p in tokenizer_file.parent.glob("tokenizer*"))
        raise PrepareError(
            f"no tokenizer file {tokenizer_file}" + (f" (beside it: {', '.join(beside)})"
                                                     if beside else "")
            + ". To fix: give the model's tokenizer.json, or its folder holding one (a "
            "tokenizer.model alone is a slow tokenizer: transformers' "
            "AutoTokenizer.from_pretrained(folder).save_pretrained(folder) writes the "
            "tokenizer.json beside it)")
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception
        raise PrepareError(f"{tokenizer_file} is not a tokenizer tokenizers reads ({exc}). "
                           "To fix: give the tokenizer.json Hugging Face's save_pretrained "
                           "wrote") from None
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    dtype = np.uint16 if vocab <= 2**16 else np.uint32
    eod_id = end_of_document(tokenizer, eod, special_tokens(tokenizer_file).get("eos_token"))
    with tempfile.TemporaryDirectory(prefix="raytrain-prepare-") as staging:
        store = open_store(out) if is_remote(out) else None
        folder = Path(staging) if store is not None else Path(out).expanduser()
        folder.mkdir(parents=True, exist_ok=True)

        def finished(path: Path) -> None:  # a complete shard: into the bucket
            if store is not None:
                store.put_file(path, path.name)
                path.unlink()

        writer = _ShardWriter(folder, dtype, shard_tokens, finished)
        skipped = Skipped(skip_bad)
        if chat:
            try:
                encoder = ChatEncoder(tokenizer, tokenizer_file, eod_id, chat_template)
            except ChatError as exc:
                raise PrepareError(str(exc)) from None
            index = _tokenize_chat(paths, encoder, writer, dtype, progress, skipped)
        else:
            index = _tokenize(paths, tokenizer, writer, dtype, eod_id, field, column, progress,
                              skipped)
        index = {"version": 1, "dtype": np.dtype(dtype).name, "vocab_size": vocab,
                 "eod_token": eod_id, **index, **skipped.index()}
        if chat:
            index = {**index, "masked": True, "chat_template": encoder.templated}
        text = json.dumps(index, indent=1) + "\n"
        if store is not None:
            store.put_bytes(INDEX, text.encode())
        else:
            (folder / INDEX).write_text(text)
    return index


def _tokenize(paths: list[Path], tokenizer: Any, writer: _ShardWriter, dtype: Any,
              eod_id: int, field: str, column: str,
              progress: Callable[[int, int], None] | None, skipped: Skipped
              ) -> dict[str, Any]:
    """Every document into the writer's shards; the index's counts and shards."""
    count = 0

    def encode(batch: list[str]) -> np.ndarray:
        encoded = tokenizer.encode_batch_fast(batch, add_special_tokens=False)  # no offsets
        ids = [e.ids for e in encoded]
        flat = chain.from_iterable(chain.from_iterable((i, (eod_id,)) for i in ids))
        return np.fromiter(flat, dtype=dtype, count=sum(map(len, ids)) + len(ids))

    # Encoding (tokenizers' threads, without the interpreter lock) overlaps reading and
    # parsing the next batch; the order of the output is the input's.
    with ThreadPoolExecutor(1, thread_name_prefix="raytrain-encode") as pool:
        pending: Future[np.ndarray] | None = None
        sizes: list[int] = []
        for batch in _batches((doc for path in paths
                               for doc in documents(path, field, column, skipped))):
            if pending is not None:
                writer.add(pending.result())
                count += sizes.pop(0)
                if progress is not None:
                    progress(count, writer.tokens)
            pending = pool.submit(encode, batch)
            sizes.append(len(batch))
        if pending is not None:
            writer.add(pending.result())
            count += sizes.pop(0)
            if progress is not None:
                progress(count, writer.tokens)
    return {"documents": count, "tokens": writer.tokens, "shards": writer.close()}


def _tokenize_chat(paths: list[Path], encoder: ChatEncoder, writer: _ShardWriter, dtype: Any,
                   progress: Callable[[int, int], None] | None, skipped: Skipped
                   ) -> dict[str, Any]:
    """Every example into the writer's shards with its trained spans; a bad one refused, or
    left out and counted (`skipped`)."""
    def examples() -> Iterator[tuple[list[dict[str, str]], str]]:
        for path in paths:
            with open(path, encoding="utf-8") as handle:
                for number, line in enumerate(handle, 1):
                    if line.strip():
                        where = f"{path}:{number}"
                        try:
                            yield messages_of(json_line(line, where), where), where
                        except ChatError as exc:
                            skipped.refuse(str(exc))

    count = 0
    for batch in _batches(examples()):
        try:
            encoded = encoder.encode(batch)
        except ChatError as exc:
            if not skipped.skip:
                raise PrepareError(str(exc)) from None
            encoded = []
            for example in batch:  # find the bad ones
                try:
                    encoded += encoder.encode([example])
                except ChatError as bad:
                    skipped.refuse(str(bad))
        for ids, trained in encoded:
            writer.add(ids.astype(dtype), trained)
        count += len(encoded)
        if progress is not None:
            progress(count, writer.tokens)
    return {"documents": count, "tokens": writer.tokens, "shards": writer.close()}


def _batches(items: Iterator[T]) -> Iterator[list[T]]:
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == BATCH_DOCUMENTS:
            yield batch
            batch = []
    if batch:
        yield batch


class _ShardWriter:
    """Tokens appended to shard files of at most `shard_tokens` each."""

    def __init__(self, folder: Path, dtype: Any, shard_tokens: int,
                 finished: Callable[[Path], None] = lambda path: None) -> None:
        self.folder, self.dtype, self.limit = folder, dtype, shard_tokens
        self.finished = finished  # told of each shard once it is complete
        self.shards: list[dict[str, Any]] = []
        self.tokens = 0
        self._handle: Any = None
        self._in_shard = 0
        self._digest: Any = None
        self._spans: list[np.ndarray] = []  # the shard's trained spans so far (chat)

    def add(self, ids: np.ndarray, trained: np.ndarray | None = None) -> None:
        """Append `ids`; `trained`: whether each one's loss is taken (chat examples)."""
        while len(ids):
            if self._handle is None:
                name = f"shard-{len(self.shards):05d}.bin"
                self._handle = open(self.folder / name, "wb")
                self._digest = hashlib.sha256()
                self.shards.append({"file": name, "tokens": 0})
                self._in_shard = 0
            piece = ids[:self.limit - self._in_shard]
            if trained is not None:
                self._spans.append(spans_of(trained[:len(piece)]) + self._in_shard)
                trained = trained[len(piece):]
            data = piece.tobytes()
            self._handle.write(data)
            self._digest.update(data)
            self._in_shard += len(piece)
            self.tokens += len(piece)
            self.shards[-1]["tokens"] = self._in_shard
            ids = ids[len(piece):]
            if self._in_shard == self.limit:
                self._finish()

    def _finish(self) -> None:
        self._handle.close()
        shard = self.shards[-1]
        shard["sha256"] = self._digest.hexdigest()
        self._handle = None
        self.finished(self.folder / shard["file"])
        if self._spans:
            spans = _joined(np.concatenate(self._spans))
            shard["spans"] = shard["file"].removesuffix(".bin") + ".spans"
            spans.astype(SPANS_DTYPE).tofile(self.folder / shard["spans"])
            self._spans = []
            self.finished(self.folder / shard["spans"])

    def close(self) -> list[dict[str, Any]]:
        if self._handle is not None:
            self._finish()
        return self.shards


def _joined(spans: np.ndarray) -> np.ndarray:
    """Spans with those that touch (one ending where the next starts) made one."""
    if len(spans) < 2:
        return spans
    touching = spans[1:, 0] == spans[:-1, 1]
    starts = spans[np.concatenate([[True], ~touching]), 0]
    ends = spans[np.concatenate([~touching, [True]]), 1]
    return np.stack([starts, ends], axis=1)
