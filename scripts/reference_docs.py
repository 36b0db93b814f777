"""Write the docs' reference pages from the code: the job spec from its pydantic models, the
HTTP API from the service's OpenAPI document, the command line from its parser.

    python scripts/reference_docs.py          # writes docs/reference/{job-spec,http-api,cli}.md
    python scripts/reference_docs.py --check  # exit 1, naming the stale pages, if any differs

tests/pure/test_docs.py fails when a page is stale. Written by hand because the models carry
what a reader needs (types, defaults, constraints, descriptions) and mkdocs plugins that
render pydantic or argparse pull in a Python runtime at build time; this keeps the site a
plain set of Markdown pages.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / "docs" / "reference"
CONSTRAINTS = ("gt", "ge", "lt", "le", "min_length", "max_length", "pattern", "multiple_of")


def _type_name(annotation: Any) -> str:
    """A field's type as a reader writes it: `int`, `list[str]`, `'fsdp' | 'data'`."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_name(a) for a in args)}]"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " \\| ".join(repr(m.value) for m in annotation)
    return getattr(annotation, "__name__", str(annotation))


def _nested_models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _nested_models(a)]


def _default(field: Any) -> str:
    if field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:  # a factory of the validated data
            return "(computed)"
    else:
        return "required"
    if isinstance(value, BaseModel):
        return "(its section's defaults)"
    if isinstance(value, Enum):
        value = value.value
    return f"`{json.dumps(value, default=str)}`"


def _constraints(field: Any) -> str:
    found = []
    for item in field.metadata:
        for name in CONSTRAINTS:
            value = getattr(item, name, None)
            if value is not None:
                found.append(f"{name} {value}")
    return ", ".join(found)


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def model_tables(model: type[BaseModel], prefix: str, seen: set[type[BaseModel]]
                 ) -> list[str]:
    """One table per model: its fields (dotted from the document's root), then each nested
    model's, depth first (a model in two places, under each: `seen` guards only a model
    nested in itself)."""
    lines = [f"### `{prefix or model.__name__}`", ""]
    doc = (model.__doc__ or "").strip().split("\n\n")[0]
    if doc and not doc.startswith(("Usage docs", "!!!")):
        lines += [_cell(doc), ""]
    lines += ["| field | type | default | constraints | description |",
              "|---|---|---|---|---|"]
    nested = []
    for name, field in model.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        lines.append(f"| `{path}` | {_type_name(field.annotation)} | {_default(field)} | "
                     f"{_constraints(field)} | {_cell(field.description or '')} |")
        for inner in _nested_models(field.annotation):
            if inner not in seen:  # a model inside itself: once
                nested.append((inner, path))
    lines.append("")
    for inner, path in nested:
        lines += model_tables(inner, path, seen | {inner})
    return lines


def job_spec_page() -> str:
    from raytrain.spec import JobSpec

    return "\n".join([
        "# The job spec", "",
        "Every field of a job (`raytrain submit FILE`, `POST /v1/jobs`), generated from the",
        "pydantic models in `raytrain/spec/` by `scripts/reference_docs.py`. Unknown keys are",
        "errors; a bad spec is refused as a whole, each bad field named with its fix. The",
        "guides show the fields at work: [the job spec by example](../guides/job-spec.md).", "",
        *model_tables(JobSpec, "", {JobSpec})]) + "\n"


def http_page() -> str:
    from raytrain.serve.http.app import build_app

    document = build_app(None).openapi()
    lines = ["# HTTP API reference", "",
             "Every route of the service, generated from its OpenAPI document (served at",
             "`/openapi.json`; Swagger UI at `/docs`) by `scripts/reference_docs.py`. The",
             "[HTTP API guide](http.md) shows them in use.", ""]
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            lines += [f"## `{method.upper()} {path}`", ""]
            summary = operation.get("description") or operation.get("summary") or ""
            if summary:
                lines += [_cell(summary), ""]
            body = operation.get("requestBody", {}).get("content", {})
            for kind, content in body.items():
                ref = content.get("schema", {}).get("$ref", "")
                lines += [f"Body ({kind}): `{ref.rsplit('/', 1)[-1] or 'see /openapi.json'}`",
                          ""]
            params = operation.get("parameters", [])
            if params:
                lines += ["| parameter | in | required | description |", "|---|---|---|---|"]
                lines += [f"| `{p['name']}` | {p['in']} | {p.get('required', False)} | "
                          f"{_cell(p.get('description', ''))} |" for p in params]
                lines.append("")
            answers = ", ".join(f"{code}" for code in operation.get("responses", {}))
            open_route = operation.get("security") == []
            lines += [f"Answers: {answers}. {'Open (no token).' if open_route else 'Token.'}",
                      ""]
    return "\n".join(lines) + "\n"


def cli_page() -> str:
    import os

    from raytrain.cli.parser import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal's width: a fixed one
    parser = build_parser()
    parser.prog = "raytrain"
    lines = ["# Command-line reference", "",
             "Every `raytrain` command and flag, generated from its parser by",
             "`scripts/reference_docs.py` (`raytrain CMD --help` says the same).", "",
             "```text", parser.format_help().rstrip(), "```", ""]
    for action in parser._actions:  # noqa: SLF001 - argparse keeps subcommands only there
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001 - the same
            for name, sub in action.choices.items():
                sub.prog = f"raytrain {name}"
                lines += [f"## `raytrain {name}`", "", "```text", sub.format_help().rstrip(),
                          "```", ""]
    return "\n".join(lines) + "\n"


GENERATED = {"job-spec.md": job_spec_page, "http-api.md": http_page, "cli.md": cli_page}


def stale() -> list[str]:
    """The reference pages whose text differs from what the code writes now."""
    return [name for name, page in GENERATED.items()
            if not (PAGES / name).is_file() or (PAGES / name).read_text() != page()]


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    check = args.parse_args(argv).check
    if check:
        found = stale()
        for name in found:
            print(f"docs/reference/{name} is stale: run python scripts/reference_docs.py")
        return 1 if found else 0
    PAGES.mkdir(parents=True, exist_ok=True)
    for name, page in GENERATED.items():
        (PAGES / name).write_text(page())
        print(f"wrote docs/reference/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
