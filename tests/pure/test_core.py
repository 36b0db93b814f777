"""The pure core: batch indexing, learning-rate schedule, admission, and its import rule."""

from __future__ import annotations

import ast
import sys
import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raytrain.core.batching import BatchPlan
from raytrain.core.queue import admit, worker_group_demand
from raytrain.core.schedule import lr_batch_scale, lr_multiplier
from raytrain.spec.layout import (
    DEGREES,
    FREE_DEGREE,
    ModelShape,
    check_layout,
    resolve_layout,
)

PACKAGE = Path(__file__).resolve().parents[2] / "raytrain"


def _imports(folder: Path, only: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(module file, imported name) for each import in `folder`'s modules (or only those
    named, at its top)."""
    found = []
    for module in [folder / name for name in only] if only else folder.rglob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Import):
                found += [(module.name, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                found.append((module.name, node.module or ""))
    return found


def _allowed(name: str, prefixes: tuple[str, ...]) -> bool:
    top = name.split(".")[0]
    return top in sys.stdlib_module_names or top == "__future__" or name.startswith(prefixes)


def test_core_imports_only_stdlib_spec_and_the_catalogs_values() -> None:
    # Decisions only: no Ray, torch, boto3, httpx or files (spec.files reads them). numpy
    # is array arithmetic, no effects: the hindsight-optimal schedule's tables.
    allowed = ("raytrain.spec", "raytrain.core", "raytrain.errors", "raytrain.catalog.hardware",
               "raytrain.catalog.prices", "raytrain.catalog.spot_trace", "numpy")
    for module, name in _imports(PACKAGE / "core"):
        assert _allowed(name, allowed), f"core/{module} imports {name}"


def test_spec_is_data_and_validation_and_imports_nothing_from_core() -> None:
    allowed = ("raytrain.spec", "raytrain.errors", "raytrain.catalog.hardware",
               "raytrain.catalog.prices", "pydantic", "pydantic_core", "yaml")
    for module, name in _imports(PACKAGE / "spec"):
        assert _allowed(name, allowed), f"spec/{module} imports {name}"


def test_the_catalog_imports_nothing_after_it() -> None:
    """The first layer: GPU kinds, links, shapes, prices and traces, from the standard
    library and YAML only (reading them into spec's documents is raytrain.spec.files)."""
    allowed = ("raytrain.catalog", "raytrain.errors", "yaml")
    for module, name in _imports(PACKAGE / "catalog"):
        assert _allowed(name, allowed), f"catalog/{module} imports {name}"


def test_the_client_imports_nothing_of_the_service() -> None:
    """`pip install raytrain` is the client: it finds its token in raytrain.api_tokens, not in the
    service's modules."""
    allowed = ("raytrain.errors", "raytrain.spec", "raytrain.api_tokens", "raytrain.catalog",
               "httpx")
    for module, name in _imports(PACKAGE, only=("client.py", "api_tokens.py")):
        assert _allowed(name, allowed), f"{module} imports {name}"


def test_the_service_layers_point_one_way() -> None:
    """The service's sub-packages, bottom up: the Ray adaptors (what the job manager drives),
    the job manager, the HTTP front, and the modules at the top of serve/ that put them
    together (deploy, detached). The simulator drives the job manager and is not the service:
    nothing in serve/ imports it."""
    above = {"adaptors": ("raytrain.serve.jobs", "raytrain.serve.http", "raytrain.sim"),
             "jobs": ("raytrain.serve.http", "raytrain.sim", "raytrain.serve.deploy",
                      "raytrain.serve.detached"),
             "http": ("raytrain.sim", "raytrain.serve.deploy", "raytrain.serve.detached")}
    for package, forbidden in above.items():
        for module, name in _imports(PACKAGE / "serve" / package):
            assert not name.startswith(forbidden), f"serve/{package}/{module} imports {name}"
    top = [path.name for path in (PACKAGE / "serve").glob("*.py")]
    assert len(top) <= 5, top


def _module_graph() -> dict[str, set[str]]:
    """Each raytrain module and the raytrain modules it imports, wherever the import sits (in
    a function, under TYPE_CHECKING): a lazy import is still an arrow."""
    modules = {".".join(f.relative_to(PACKAGE.parent).with_suffix("").parts)
               .removesuffix(".__init__"): f for f in PACKAGE.rglob("*.py")}

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([base] if base else [])])
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            for target in targets:
                found = owner(target) if target.startswith("raytrain") else None
                if found and found != name and not name.startswith(found + "."):
                    graph[name].add(found)
    return graph


def test_no_module_imports_one_that_imports_it_back() -> None:
    """No import circle among raytrain's modules (a package importing its own modules aside):
    each module can be read, and tested, after the ones it uses."""
    graph = _module_graph()
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        seen[name] = 1
        for used in sorted(graph[name]):
            assert seen.get(used) != 1, "import circle: " + " -> ".join(
                [*path[path.index(used):], used] if used in path else [*path, used])
            if used not in seen:
                visit(used, [*path, used])
        seen[name] = 2

    for name in sorted(graph):
        if name not in seen:
            visit(name, [name])


@st.composite
def batch_plans(draw: st.DrawFn) -> BatchPlan:
    micro = draw(st.integers(1, 8))
    dp = draw(st.integers(1, 8))
    accum = draw(st.integers(1, 4))
    return BatchPlan(micro * dp * accum, micro, dp)


# What one reading holds: past these a module is likely two and a function does two things,
# which a warning says; a module is cut by concept, never to meet the figure. Past the hard
# limits the test fails.
MODULE_LINES, FUNCTION_LINES = (400, 600), (80, 120)


def test_no_module_or_function_outgrows_what_one_reading_holds() -> None:
    """Module doc of the limits above: the soft ones warn, the hard ones fail."""
    soft, hard = [], []
    for module in PACKAGE.rglob("*.py"):
        text = module.read_text()
        name = module.relative_to(PACKAGE.parent)
        lines = len(text.splitlines())
        for limit, found in zip(MODULE_LINES, (soft, hard)):
            if lines > limit:
                found.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                for limit, found in zip(FUNCTION_LINES, (soft, hard)):
                    if length > limit:
                        found.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    for long in soft:
        warnings.warn(f"long: {long}", stacklevel=1)
    assert hard == []


@given(batch_plans(), st.integers(0, 1000))
def test_each_step_reads_its_global_batch_exactly_once(plan: BatchPlan, step: int) -> None:
    seen = [
        index
        for micro in range(plan.grad_accum_steps)
        for rank in range(plan.dp_degree)
        for index in plan.sample_range(step, micro, rank)
    ]
    expected = range(step * plan.global_batch_size, (step + 1) * plan.global_batch_size)
    assert sorted(seen) == list(expected)


@given(st.integers(1, 64), st.integers(0, 500))
def test_data_position_does_not_depend_on_rank_count(global_batch: int, steps: int) -> None:
    positions = {
        BatchPlan(global_batch, global_batch // dp, dp).samples_consumed(steps)
        for dp in range(1, global_batch + 1)
        if global_batch % dp == 0
    }
    assert positions == {steps * global_batch}


def test_batch_plan_rejects_indivisible_batches() -> None:
    with pytest.raises(ValueError):
        BatchPlan(10, 4, 2)


@given(st.integers(0, 50), st.integers(1, 500), st.floats(0, 1))
def test_lr_multiplier_warms_up_then_decays_to_the_floor(
    warmup: int, extra: int, floor: float
) -> None:
    total = warmup + extra
    values = [lr_multiplier(s, warmup, total, floor) for s in range(total)]
    assert all(0.0 < v <= 1.0 + 1e-12 for v in values[:warmup])
    assert all(floor - 1e-12 <= v <= 1.0 + 1e-12 for v in values[warmup:])
    assert values[warmup:] == sorted(values[warmup:], reverse=True)
    assert values[:warmup] == sorted(values[:warmup])
    assert lr_multiplier(total, warmup, total, floor) == pytest.approx(floor)


def test_admission_counts_what_running_jobs_hold() -> None:
    demand = worker_group_demand(2, 1.0, 0.0)
    assert admit(demand, {"CPU": 2.0}, []).fits
    waiting = admit(demand, {"CPU": 2.0}, [{"CPU": 1.0}])
    assert not waiting.fits and "free 1 of 2" in waiting.reason
    gpu = worker_group_demand(4, 2.0, 1.0)
    assert gpu == {"CPU": 8.0, "GPU": 4.0}
    assert not admit(gpu, {"CPU": 64.0}, []).fits  # no GPUs at all


@given(
    st.sampled_from(["data", "fsdp", "tensor", "pipeline"]),
    st.lists(st.sampled_from([1, 2, 4]), min_size=4, max_size=4),
    st.sampled_from([1, 2, 4, 8, 16]),
)
def test_a_resolved_layout_covers_the_workers_or_says_why(
    strategy: str, given_degrees: list[int], world: int
) -> None:
    given_map = dict(zip(DEGREES, given_degrees))
    given_map[FREE_DEGREE[strategy]] = None  # the strategy's own degree is left out
    layout, problems = resolve_layout(strategy, world, given_map)
    if problems:
        assert all(p.field[0] == "parallel" and "To fix" in p.message for p in problems)
    else:
        assert layout.world_size == world


def test_layout_checks_name_what_would_fit() -> None:
    layout, _ = resolve_layout("hybrid", 8, {"pp": 4, "tp": 2}, virtual_stages=2,
                               schedule="interleaved_1f1b", microbatches=6)
    problems = check_layout(layout, ModelShape(num_layers=5, num_heads=4, hidden_dim=64,
                                               vocab_size=100), seq_len=32, built_in_model=True)
    messages = " | ".join(p.message for p in problems)
    assert "8 stages, but the model has 5 layers" in messages
    assert "multiple of pp=4" in messages
    assert layout.describe() == "tp2 pp4 interleaved_1f1b v2 mb1x6 sequence parallel"


def test_lr_batch_scale_rules() -> None:
    assert lr_batch_scale("none", 1024, 256) == 1.0
    assert lr_batch_scale("linear", 1024, 256) == 4.0
    assert lr_batch_scale("sqrt", 1024, 256) == 2.0
    assert lr_batch_scale("linear", 1024, None) == 1.0


def test_a_tiny_ask_per_worker_is_counted_without_overflow() -> None:
    """A worker asking 1e-300 CPU fits anywhere; counting how many a node holds must not
    overflow (the API's 422 path asks this of any schema-valid resources)."""
    from raytrain.core.queue import never_fits

    assert never_fits(4, {"CPU": 1e-300}, [{"CPU": 2.0}]) is None
    assert never_fits(100_000, {"CPU": 5e-324}, [{"CPU": 2.0}]) is None
    assert never_fits(3, {"CPU": 0.3}, [{"CPU": 0.9}]) is None  # 0.9 // 0.3 is 2.0 in floats
    assert "room for 2" in never_fits(4, {"CPU": 1.0}, [{"CPU": 2.0}])


def test_no_test_module_doubles_as_a_helper() -> None:
    """Tests and benchmarks share helpers through tests/support only: no module imports a test
    module or a conftest (they did: the service harness lived in a test module six others
    imported, and benchmarks imported tests)."""
    repo = PACKAGE.parent
    for folder in (repo / "tests", repo / "benchmarks"):
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                for name in names:
                    last = name.split(".")[-1]
                    assert not (name.startswith("tests") and (
                        last.startswith("test_") or last == "conftest")), \
                        f"{path.relative_to(repo)} imports {name}"


def test_no_test_monkeypatches_raytrain() -> None:
    """What a test replaces in raytrain it passes as an argument (a planner, the Serve API,
    the auth pace): no `monkeypatch.setattr` on a raytrain module or a name imported from
    one (three tests did: the planner, deploy's Serve, auth's constants)."""
    for path in (PACKAGE.parent / "tests").rglob("*.py"):
        tree = ast.parse(path.read_text())
        ours = {alias.asname or alias.name for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("raytrain")
                for alias in node.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr == "setattr" and node.args:
                target = node.args[0]
                named = isinstance(target, ast.Name) and target.id in ours
                dotted = isinstance(target, ast.Constant) and str(target.value).startswith(
                    "raytrain")
                assert not (named or dotted), f"{path.name}:{node.lineno} patches raytrain"
