"""The docs match the code: the reference pages are what scripts/reference_docs.py writes
from it now (the job spec with every field's type, default, constraints and description,
the HTTP routes, the CLI), no docstring or page names a module that does not exist, and the
README stays a short quick start whose first code block is the two set-up commands."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from types import ModuleType

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]


def _reference_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reference_docs",
                                                  ROOT / "scripts" / "reference_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reference_pages_are_what_the_code_writes_now() -> None:
    """Change a field's description, a route or a flag and this fails until
    `python scripts/reference_docs.py` is run again."""
    assert _reference_docs().stale() == []


def test_every_job_spec_field_is_in_the_reference_with_its_description() -> None:
    from raytrain.spec import JobSpec

    page = (ROOT / "docs" / "reference" / "job-spec.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in page.splitlines()
            if line.startswith("| `")}

    def walk(model: type[BaseModel], prefix: str, seen: set[type[BaseModel]]) -> int:
        count = 0
        for name, field in model.model_fields.items():
            path = f"{prefix}.{name}" if prefix else name
            row = rows.get(f"`{path}`")
            assert row is not None, path
            assert (field.description or "").split()[:3] == [] or \
                " ".join((field.description or "").split()[:3]) in row, path
            count += 1
            for inner in _models(field.annotation):
                if inner not in seen:
                    count += walk(inner, path, seen | {inner})
        return count

    assert walk(JobSpec, "", {JobSpec}) > 100


def _models(annotation: object) -> list[type[BaseModel]]:
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models(a)]


def _texts() -> list[tuple[Path, str]]:
    """Every docstring of the code, tests, benchmarks and scripts; every page of the docs."""
    found = []
    for folder in ("raytrain", "tests", "benchmarks", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                     ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if doc:
                        found.append((path, doc))
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        found.append((path, path.read_text()))
    return found


def _module_file(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _names_a_missing_module(parts: list[str]) -> bool:
    """raytrain.a.b.c: the longest prefix that is a module must hold the rest's first name."""
    for end in range(len(parts), 1, -1):
        found = _module_file(parts[:end])
        if found is not None:
            rest = parts[end:]
            return bool(rest) and re.search(rf"\b{re.escape(rest[0])}\b",
                                            found.read_text()) is None
    return True


def test_no_docstring_or_page_names_a_module_that_does_not_exist() -> None:
    """Dotted names from raytrain, paths under raytrain/, and the service's own short names
    (serve.NAME, sim.NAME: modules moved when serve/ was split kept their old names in 45
    docstrings). A dotted
    name whose second part is no package of raytrain's is not a module (a tag such as
    raytrain.state); neither is a path whose first part is not."""
    packages = {p.name for p in (ROOT / "raytrain").iterdir()} | \
        {p.stem for p in (ROOT / "raytrain").glob("*.py")}
    dotted = re.compile(r"\braytrain(?:\.[A-Za-z_]\w*)+")
    paths = re.compile(r"\braytrain/[\w/-]+(?:\.\w+)?")
    relative = re.compile(r"(?<![\w./])(serve|sim)\.([a-z_]\w*)(?:\.[A-Za-z_]\w*)*")
    ray_serve = {"run", "delete", "shutdown", "start", "deployment", "get_app_handle",
                 "status", "ingress", "batch", "multiplexed", "config", "schema", "handle"}
    missing = []
    for path, text in _texts():
        where = path.relative_to(ROOT)
        for match in dotted.finditer(text):
            parts = match.group(0).rstrip(".").split(".")
            if len(parts) > 1 and parts[1] in packages and _names_a_missing_module(parts):
                missing.append((where, match.group(0)))
        for match in paths.finditer(text):
            first = match.group(0).split("/")[1]
            target = ROOT / match.group(0).rstrip("/")
            if first in packages and not target.exists() and \
                    not target.with_suffix(".py").exists():
                missing.append((where, match.group(0)))
        for match in relative.finditer(text):
            if match.group(1) == "serve" and match.group(2) in ray_serve:
                continue  # Ray Serve's own functions
            parts = ["raytrain", *match.group(0).split(".")]
            if _names_a_missing_module(parts):
                missing.append((where, match.group(0)))
    assert not missing, missing


def test_the_readme_is_a_short_quick_start() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 16 * 1024
    first = re.search(r"```bash\n(.*?)```", readme, re.S)
    assert first is not None
    commands = [line for line in first.group(1).splitlines() if line.startswith("python3")]
    assert len(commands) == 2 and commands[0].endswith("raytrain demo")
    assert commands[1].endswith("python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "mkdocs build --strict" in ci


def test_benchmarks_import_no_tests() -> None:
    """DESIGN: benchmarks import no tests; what they share with the tests (fakes, local servers)
    is raytrain.testing. Fails on an `import tests...` or `from tests... import` anywhere in
    benchmarks/, inside a function too."""
    importing = re.compile(r"^\s*(?:from|import)\s+tests\b", re.MULTILINE)
    offenders = [path.name for path in sorted((ROOT / "benchmarks").glob("*.py"))
                 if importing.search(path.read_text())]
    assert not offenders, offenders
