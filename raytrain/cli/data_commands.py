"""`raytrain data prepare`: a corpus into token shards a job trains on (raytrain.data.prepare),
with a progress line; `raytrain export`: a job's checkpoint as a Hugging Face folder
(raytrain.train.export), written where the command runs."""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

from rich.markup import escape

from raytrain.cli.commands import err, out


def add_data_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    data = command("data", "prepare training data", of_a_service=False)
    actions = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    prepare = actions.add_parser(
        "prepare", help="tokenize text, JSONL or Parquet into token shards with an index")
    prepare.add_argument("inputs", nargs="+", metavar="INPUT",
                         help=".txt (one document per file), .jsonl or .parquet files")
    prepare.add_argument("--tokenizer", required=True,
                         help="the model's tokenizer.json (or the folder holding it)")
    prepare.add_argument("--out", required=True, help="the folder to write the shards to, or "
                         "s3://BUCKET/PREFIX (each shard put there once complete, the index "
                         "last)")
    prepare.add_argument("--field", default="text", help="JSONL: the text field (text)")
    prepare.add_argument("--column", default="text", help="Parquet: the text column (text)")
    prepare.add_argument("--eod", help="the end-of-document token (default: the eos_token of "
                         "the tokenizer_config.json beside the tokenizer, else its "
                         "<|endoftext|>, </s>, ...)")
    prepare.add_argument("--shard-tokens", type=int, default=100_000_000,
                         help="tokens per shard file (100,000,000)")
    prepare.add_argument("--chat", action="store_true", help="fine-tuning examples: JSONL "
                         "lines with `messages` ({role, content}) or `prompt` and `response`; "
                         "the loss is taken on the assistant's turns only (rendered by the "
                         "tokenizer's chat template when it has one: chat_template.jinja "
                         "beside it, else tokenizer_config.json's chat_template)")
    prepare.add_argument("--chat-template", metavar="NAME", help="with --chat: the named "
                         "template to render with (additional_chat_templates/NAME.jinja, or "
                         "a named entry of tokenizer_config.json); default: the default one")
    prepare.add_argument("--skip-bad", action="store_true", help="leave out the examples "
                         "or documents that cannot be read (each refusal names its file and "
                         "line), and count them in the summary, where one stops the prepare")
    prepare.set_defaults(func=cmd_data_prepare)

    export = command("export", "write a kind 'hf' job's checkpoint as a Hugging Face folder "
                     "(config.json, safetensors): here (--to), or by the service in the "
                     "job's storage (--in-storage)")
    export.add_argument("id", help="the job")
    where = export.add_mutually_exclusive_group(required=True)
    where.add_argument("--to", help="the folder to write, here (needs the full install and "
                       "the checkpoint's storage)")
    where.add_argument("--in-storage", action="store_true", help="the service writes it in "
                       "the job's storage, exports/step_<N>, and prints where")
    export.add_argument("--step", type=int, default=None,
                        help="a committed checkpoint's step (default: the latest)")
    export.add_argument("--merge", action="store_true", help="a training.lora job: the adapter "
                        "folded into the weights (a whole model), not the adapter as a PEFT "
                        "folder")
    export.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="the "
                        "dtype to write the weights in (default: the one the source folder's "
                        "config.json states, as save_pretrained writes)")
    export.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from raytrain.cli.commands import _client
    from raytrain.core.exports import checkpoint_to_export
    from raytrain.errors import RaytrainError

    client = _client(args)
    try:
        if args.in_storage:
            answer = client.export(args.id, args.step, args.merge, args.dtype)
            out.print(answer.path, highlight=False, soft_wrap=True)
            return 0
        status = client.get(args.id)
        _, ref = checkpoint_to_export(status, args.step)
        from raytrain.train.export import export_checkpoint

        folder = export_checkpoint(status.spec, ref, args.to, args.merge, args.dtype)
    except ImportError as exc:
        err.print(f"[red]error:[/red] export needs the full install ({escape(str(exc))}). "
                  "To fix: pip install raytrain (not the client-only one), or use "
                  "--in-storage", highlight=False)
        return 2
    except (RaytrainError, OSError) as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    out.print(str(folder), highlight=False, soft_wrap=True)  # a path: never wrapped
    return 0


def cmd_data_prepare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from raytrain.cloud.object_store import is_remote
    from raytrain.data.prepare import PrepareError, prepare
    from raytrain.errors import RaytrainError

    tokenizer = Path(args.tokenizer).expanduser()
    if tokenizer.is_dir():
        tokenizer = tokenizer / "tokenizer.json"
    began = time.monotonic()
    shown = [0.0]

    def progress(documents: int, tokens: int) -> None:
        now = time.monotonic()
        if now - shown[0] >= 0.5:
            shown[0] = now
            rate = tokens / max(now - began, 1e-9)
            err.print(f"{documents:,} documents, {tokens:,} tokens ({rate:,.0f}/s)",
                      end="\r", highlight=False)

    try:
        index: dict[str, Any] = prepare(args.inputs, str(tokenizer), args.out,
                                        field=args.field, column=args.column, eod=args.eod,
                                        shard_tokens=args.shard_tokens, progress=progress,
                                        chat=args.chat, chat_template=args.chat_template,
                                        skip_bad=args.skip_bad)
    except (PrepareError, OSError, ValueError, RaytrainError) as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    seconds = time.monotonic() - began
    kind = "examples" if args.chat else "documents"
    # The path a job names: the service resolves a relative one against its own folder.
    where = args.out if is_remote(args.out) else str(Path(args.out).expanduser().resolve())
    out.print(f"{index['documents']:,} {kind}, {index['tokens']:,} tokens ({index['dtype']}) "
              f"in {len(index['shards'])} shard(s) at {escape(where)} in {seconds:.1f} s; "
              f"train on it with data.kind token_file, data.path {escape(where)}",
              highlight=False)
    if index.get("skipped"):
        err.print(f"[yellow]skipped {index['skipped']:,} bad {kind}[/yellow] (--skip-bad), "
                  f"the first: {escape(index['skipped_first'][0])}", highlight=False)
    return 0
