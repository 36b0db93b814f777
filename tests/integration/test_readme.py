"""Every Python snippet in the README runs, in order, against the real service."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration.conftest import Service

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


def readme_snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_every_python_snippet_in_the_readme_runs(service: Service,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    snippets = readme_snippets()
    assert len(snippets) >= 2
    namespace: dict[str, object] = {}
    for snippet in snippets:
        code = snippet.replace("http://127.0.0.1:8000", service.url).replace(
            '"examples/', f'"{ROOT}/examples/')
        exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    printed = capsys.readouterr().out
    assert "SUCCEEDED" in printed and "rank 0:" in printed
