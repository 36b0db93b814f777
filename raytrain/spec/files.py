"""Reading the data files: the shipped offer snapshot, the refreshed offer cache, the named
policies, the spot traces and this machine's measured CPU profile (`raytrain calibrate`).
All but the last ship inside the package (catalog/offers.yaml,
catalog/policies/, catalog/spot-traces/, examples/), so any install finds them from any
directory; `policies/`, `examples/` and `data/spot-traces/` at the top of a checkout point
here. Files only; the decisions over them are in raytrain.core. (In spec/, not catalog/:
it makes spec's documents of the data, and the catalog imports nothing after it.)

    catalog = load_offers(Path("~/.raytrain"))       # the refreshed cache, else the snapshot
    policies = load_policies()                        # {"cost-first": PolicySpec, ...}
"""

from __future__ import annotations

import json
import logging
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from raytrain.catalog.hardware import CATALOG, CATALOG_VERSION, CPU_PROFILE_FIELDS, Catalog
from raytrain.catalog.prices import band_rate
from raytrain.errors import FieldError, SpecError
from raytrain.spec import OfferCatalog, PolicySpec, ServiceConfig, spec_error_from_validation

logger = logging.getLogger(__name__)

CACHE_FILE = "offers.json"
PROFILE_FILE = "cpu-profile.json"
CATALOG_DIR = Path(__file__).resolve().parents[1] / "catalog"  # the shipped data
DEFAULT_POLICY_DIR = CATALOG_DIR / "policies"
TRACES_DIR = CATALOG_DIR / "spot-traces"
EXAMPLES_DIR = CATALOG_DIR.parent / "examples"
DEFAULT_POLICY = "cost-first"
# libyaml's parser where PyYAML has it (several times faster: a trace replay reads its
# offers and policies once per replay), else the pure-Python one; both safe.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(text: str) -> Any:
    """yaml.safe_load, with libyaml where PyYAML has it."""
    return yaml.load(text, Loader=_SAFE_LOADER)


def snapshot() -> OfferCatalog:
    """The offers shipped with this version of raytrain."""
    text = resources.files("raytrain.catalog").joinpath("offers.yaml").read_text()
    document = read_yaml(text)
    return parse_offers({**document, "source": "snapshot", "version": CATALOG_VERSION},
                        "the shipped offer snapshot")


def parse_offers(document: dict[str, Any], source: str) -> OfferCatalog:
    """An offer catalog from a document; a Spot Advisor band stands in for a missing rate."""
    rows = []
    for row in document.get("offers", []):
        if isinstance(row, dict) and row.get("interruption_band") and \
                not row.get("spot_interruptions_per_hour"):
            try:
                row = {**row, "spot_interruptions_per_hour": band_rate(row["interruption_band"])}
            except ValueError:
                pass  # the schema reports the row; a bad band alone leaves the rate at 0
        rows.append(row)
    try:
        return OfferCatalog.model_validate({**document, "offers": rows})
    except ValidationError as exc:
        raise spec_error_from_validation(exc, source, OfferCatalog) from exc


def load_offers(state_dir: Path) -> OfferCatalog:
    """The catalog last refreshed into `state_dir`, or the snapshot with a warning."""
    cache = state_dir.expanduser() / CACHE_FILE
    if not cache.exists():
        return snapshot()
    try:
        return parse_offers(json.loads(cache.read_text()), str(cache))
    except (OSError, json.JSONDecodeError, SpecError) as exc:
        catalog = snapshot()
        warning = f"the offer cache {cache} is unreadable ({exc}); using the shipped snapshot"
        logger.warning(warning)
        return catalog.model_copy(update={"warnings": [warning]})


def save_offers(catalog: OfferCatalog, state_dir: Path) -> Path:
    """Write the catalog where load_offers finds it (atomically: a crash leaves the old one)."""
    folder = state_dir.expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / CACHE_FILE
    partial = path.with_suffix(".partial")
    partial.write_text(catalog.model_dump_json(indent=1))
    partial.replace(path)
    return path


def save_cpu_profile(state_dir: Path, figures: dict[str, float], details: dict[str, Any]
                     ) -> Path:
    """Store a measured CPU profile where load_cpu_profile finds it (atomically)."""
    folder = state_dir.expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / PROFILE_FILE
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps({"figures": figures, **details}, indent=1))
    partial.replace(path)
    return path


def load_cpu_profile(state_dir: Path) -> Catalog:
    """The catalog to plan with on this machine: the shipped one, with the CPU profile
    `raytrain calibrate` stored in `state_dir` if there is one (`catalog.gpus["cpu"]` then
    says so in its `calibration`). SpecError names a bad field and the fix."""
    path = state_dir.expanduser() / PROFILE_FILE
    if not path.exists():
        return CATALOG
    fix = f"To fix: run `raytrain calibrate` again, or delete {path}"
    try:
        figures = json.loads(path.read_text())["figures"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise SpecError([FieldError(("figures",), f"{path} is unreadable ({exc}). {fix}")]
                        ) from None
    problems = [FieldError(("figures", name), f"not a field of a CPU profile (it has "
                           f"{', '.join(CPU_PROFILE_FIELDS)}). {fix}")
                for name in figures if name not in CPU_PROFILE_FIELDS]
    problems += [FieldError(("figures", name), f"{value!r} in {path} is not a number at "
                            f"least 0 (FLOP/s above 0). {fix}")
                 for name, value in figures.items() if name in CPU_PROFILE_FIELDS and (
                     not isinstance(value, (int, float)) or isinstance(value, bool)
                     or value < 0 or (name == "fp32_flops" and value <= 0))]
    if problems:
        raise SpecError(problems)
    return CATALOG.with_cpu_profile(figures, f"raytrain calibrate on this machine ({path})")


def unknown_policy(name: str, policies: dict[str, PolicySpec],
                   loc: tuple[str, ...] = ("capacity", "policy")) -> FieldError | None:
    """The error for a policy name that is not one of `policies` (None when it is)."""
    if name in policies:
        return None
    return FieldError(loc, f"no policy named {name!r}. To fix: use one of "
                      + ", ".join(sorted(policies)))


def load_policies(policy_dir: Path | None = None) -> dict[str, PolicySpec]:
    """Every policy in the folder by name; a bad file raises SpecError naming file and field."""
    folder = policy_dir or DEFAULT_POLICY_DIR
    if not folder.is_dir():
        raise SpecError([FieldError(("policy_dir",), f"{folder} is not a folder. To fix: point "
                                    "policy_dir at the folder of policy YAML files")],
                        "service config")
    found: dict[str, PolicySpec] = {}
    for path in sorted(folder.glob("*.yaml")):
        try:
            policy = PolicySpec.model_validate(read_yaml(path.read_text()) or {})
        except ValidationError as exc:
            raise spec_error_from_validation(exc, f"policy {path}", PolicySpec) from exc
        if policy.name != path.stem:
            raise SpecError([FieldError(("name",), f"{policy.name!r} differs from the file's "
                                        f"name. To fix: name it {path.stem!r}")], f"policy {path}")
        found[policy.name] = policy
    return found


def offers_path(config: ServiceConfig) -> Path:
    """The file the service's offers come from: its offers_file, else the refresh cache."""
    if config.offers_file:
        return Path(config.offers_file).expanduser()
    return config.state_path / CACHE_FILE


def catalog_stamp(config: ServiceConfig) -> float | None:
    """When the offers the service reads last changed (None: the shipped snapshot)."""
    path = offers_path(config)
    return path.stat().st_mtime if path.exists() else None


def catalog_for(config: ServiceConfig) -> OfferCatalog:
    """The offers the service uses: its offers_file, else the refreshed cache, else the
    shipped snapshot."""
    if config.offers_file:
        path = offers_path(config)
        return parse_offers({**read_yaml(path.read_text()), "source": "file"}, str(path))
    return load_offers(config.state_path)
