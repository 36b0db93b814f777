"""The API against its own OpenAPI document, fuzzed by schemathesis over real HTTP on
127.0.0.1: every operation gets generated requests, valid and not; no answer may be a 5xx,
and each must be a status the document lists for the operation, in its content type and
schema, with the headers it promises. A bounded run (a few hundred requests); the longer one
is benchmarks/api_fuzz.py. The app is the one `raytrain serve` deploys, over a real job
manager whose Ray adaptor is the recording fake (raytrain/testing/http_service.py).

Schemathesis' pytest plugin does not run on this pytest, so each operation's cases are drawn
from its own hypothesis strategies here, with the same checks the plugin would run."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import schemathesis
from fastapi.routing import APIRoute
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raytrain.serve.http.app import build_app
from raytrain.serve.http.auth import AuthPace
from raytrain.testing.http_service import served

FUZZ_CONFIG = Path(__file__).with_name("schemathesis.toml")
EXAMPLES_PER_OPERATION = 24
OPERATIONS = [(method, path) for path, methods in build_app(None).openapi()["paths"].items()
              for method in methods]


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[schemathesis.BaseSchema]:
    """The live service's document, loaded from it; the fuzzer sends its token (the config
    reads RAYTRAIN_TOKEN). Its checks without a token would slow every request from this
    address after AuthPace.guesses_allowed of them (tested in test_access), so here they do
    not."""
    with served(tmp_path_factory.mktemp("fuzzed"),
                auth_pace=AuthPace(guesses_allowed=10**9)) as (url, token), \
            pytest.MonkeyPatch.context() as env:
        env.setenv("RAYTRAIN_TOKEN", token)
        yield schemathesis.openapi.from_url(
            f"{url}/openapi.json", config=schemathesis.Config.from_path(FUZZ_CONFIG),
            headers={"Authorization": f"Bearer {token}"})


def test_the_document_lists_every_route() -> None:
    routes = {(method.lower(), route.path) for route in build_app(None).routes
              if isinstance(route, APIRoute) and route.include_in_schema
              for method in route.methods}
    assert set(OPERATIONS) == routes and len(OPERATIONS) == 15


@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_every_answer_is_one_the_document_lists(
        api: schemathesis.BaseSchema, method: str, path: str) -> None:
    operation = api[path][method]
    cases = st.one_of(*(operation.as_strategy(mode) for mode in schemathesis.GenerationMode))
    statuses = []

    @given(cases)
    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True,
              database=None, suppress_health_check=list(HealthCheck))
    def answers_as_documented(case: schemathesis.Case) -> None:
        statuses.append(case.call_and_validate(timeout=30).status_code)

    answers_as_documented()
    # the token went with most (a case without it, or with a wrong one, must get 401)
    assert sum(status != 401 for status in statuses) >= len(statuses) / 4, statuses


def test_no_header_is_documented_as_null() -> None:
    """A header has a value or is absent; a document that allows it null makes a fuzzer send
    'null', which the service then refuses (a schema-valid request rejected)."""
    document = build_app(None).openapi()
    headers = [(path, p) for path, methods in document["paths"].items()
               for operation in methods.values() for p in operation.get("parameters", [])
               if p["in"] == "header"]
    assert headers
    for path, parameter in headers:
        assert "anyOf" not in parameter["schema"], (path, parameter)
