"""The token file a service keeps in its state directory, and how a client on this machine
finds the token to send: shared by the service (raytrain.serve.http.auth checks tokens), the
command line and the Python client, so it imports nothing of either.

`tokens.json` (mode 0600) maps names to tokens; the first start writes one named
"operator". A client sends RAYTRAIN_TOKEN, else, for a service on this machine only, the
operator token of that service's state directory.

    tokens, written = ensure_tokens(Path("~/.raytrain"))   # {"operator": "..."}, made once
    client_token("http://127.0.0.1:8000")                 # RAYTRAIN_TOKEN, else that file
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import secrets
import socket
import tempfile
from pathlib import Path
from urllib.parse import urlparse

from raytrain.errors import RaytrainError

TOKENS_FILE = "tokens.json"
SERVICES_FILE = "services.json"  # {port: state directory} of the services on this machine
OPERATOR = "operator"
TOKEN_ENV = "RAYTRAIN_TOKEN"
STATE_DIR_ENV = "RAYTRAIN_STATE_DIR"
DEFAULT_STATE_DIR = "~/.raytrain"


def tokens_path(state_dir: Path) -> Path:
    return state_dir.expanduser() / TOKENS_FILE


def read_tokens(state_dir: Path) -> dict[str, str]:
    """The tokens by name; {} when the file does not exist."""
    path = tokens_path(state_dir)
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise RaytrainError(f"cannot read the service's tokens in {path}: {exc}. To fix: "
                            "restore the file, or remove it to have a new operator token "
                            "written at the next start") from None
    if not isinstance(document, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in document.items()):
        raise RaytrainError(f"{path} is not a mapping of token names to tokens. To fix: "
                            "restore it, or remove it to start over")
    return document


def write_tokens(state_dir: Path, tokens: dict[str, str]) -> Path:
    """Replace the file atomically, readable by its owner only."""
    path = tokens_path(state_dir)
    _write_private_json(path, tokens)
    return path


def _write_private_json(path: Path, document: dict[str, str]) -> None:
    """Replace `path` with `document` atomically, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(json.dumps(document, indent=1, sort_keys=True) + "\n")
    os.chmod(partial, 0o600)
    partial.replace(path)


def new_token() -> str:
    return "rt_" + secrets.token_urlsafe(32)


def ensure_tokens(state_dir: Path) -> tuple[dict[str, str], bool]:
    """The tokens, with an operator token written first if there are none; and whether it
    was written now."""
    tokens = read_tokens(state_dir)
    if tokens:
        return tokens, False
    tokens = {OPERATOR: new_token()}
    write_tokens(state_dir, tokens)
    return tokens, True


def set_token(state_dir: Path, name: str, action: str = "add") -> str | None:
    """`add` a token for a new name, `rotate` (replace) a name's token, or `remove` it; the
    new token (None after a removal)."""
    if not name or not name.replace("-", "").replace("_", "").isalnum() or len(name) > 64:
        raise RaytrainError(f"{name!r} is not a token name. To fix: use letters, digits, "
                            "'-' and '_' (at most 64)")
    tokens = read_tokens(state_dir)
    if action == "add" and name in tokens:
        raise RaytrainError(f"a token named {name!r} exists. To fix: rotate it "
                            f"(raytrain token rotate {name}) or choose another name")
    if action == "rotate" and name not in tokens:
        raise RaytrainError(f"no token named {name!r}. To fix: add it "
                            f"(raytrain token add {name})")
    if action == "remove":
        if name not in tokens:
            raise RaytrainError(f"no token named {name!r}. To fix: use one of "
                                + (", ".join(sorted(tokens)) or "none (none exist yet)"))
        del tokens[name]
        write_tokens(state_dir, tokens)
        return None
    tokens[name] = new_token()
    write_tokens(state_dir, tokens)
    return tokens[name]


def host_addresses(host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses `host` (an address or a name) stands for; socket.gaierror when a name
    does not resolve."""
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0])
            for info in socket.getaddrinfo(host, None)]


def is_loopback(host: str) -> bool:
    """Whether every address `host` stands for is a loopback one: a name is resolved, not
    judged by its spelling (127.0.0.1.nip.io is whatever DNS says). False for a name that
    does not resolve."""
    if host == "localhost":
        return True
    try:
        addresses = host_addresses(host)
    except (OSError, UnicodeError):
        return False
    return bool(addresses) and all(address.is_loopback for address in addresses)


def default_state_dir(given: str | Path | None = None) -> Path:
    """The state directory meant: the one given, else $RAYTRAIN_STATE_DIR, else
    ~/.raytrain."""
    return Path(given or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR).expanduser()


def services_file() -> Path | None:
    """Where this user's services on this machine are noted, {port: state directory}: the
    user's runtime folder ($XDG_RUNTIME_DIR/raytrain, else raytrain-UID in the temporary
    folder), never a state directory (each holds one service's state, and only that). None
    when that folder is not this user's alone (another user could plant entries there)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    folder = Path(runtime) / "raytrain" if runtime else \
        Path(tempfile.gettempdir()) / f"raytrain-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        found = folder.stat()
    except OSError:
        return None
    if found.st_uid != os.getuid() or found.st_mode & 0o077:
        return None
    return folder / SERVICES_FILE


def remember_service(port: int, state_dir: Path) -> None:
    """Note, for clients on this machine, which state directory the service on `port` keeps
    its tokens in (services_file, owner-only): a second shell then needs neither
    --state-dir nor RAYTRAIN_STATE_DIR."""
    path = services_file()
    if path is None:
        return
    known = _remembered_services()
    known[str(port)] = str(state_dir.expanduser().resolve())
    _write_private_json(path, known)


def remembered_state_dir(port: int) -> Path | None:
    """The state directory the service last started on `port` of this machine used."""
    found = _remembered_services().get(str(port))
    return Path(found) if isinstance(found, str) else None


def _remembered_services() -> dict[str, str]:
    """{port: state directory} as `remember_service` noted them ({} if none or unreadable)."""
    path = services_file()
    try:
        known = json.loads(path.read_text()) if path is not None else {}
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def client_token(url: str, state_dir: str | Path | None = None) -> str | None:
    """The token a client sends: RAYTRAIN_TOKEN, else (for a service on this machine only)
    the operator token in its state directory: `state_dir`, else RAYTRAIN_STATE_DIR, else the
    one the service on that port was started with, else ~/.raytrain."""
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    parsed = urlparse(url)
    if not is_loopback(parsed.hostname or ""):
        return None  # never send this machine's token to another one
    folder = state_dir or os.environ.get(STATE_DIR_ENV) or \
        remembered_state_dir(parsed.port or (443 if parsed.scheme == "https" else 80))
    try:
        return read_tokens(default_state_dir(folder)).get(OPERATOR)
    except RaytrainError:
        return None


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


_DIGESTS: dict[Path, tuple[float, dict[str, str]]] = {}


def token_digests(state_dir: Path) -> dict[str, str]:
    """{name: digest} of the tokens in `state_dir` (writing the operator token on first
    use), read again only when the file changes."""
    path = tokens_path(state_dir)
    try:
        stamp = path.stat().st_mtime_ns
    except FileNotFoundError:
        ensure_tokens(state_dir)
        stamp = path.stat().st_mtime_ns
    cached = _DIGESTS.get(path)
    if cached is None or cached[0] != stamp:
        cached = (stamp, {name: digest(token) for name, token in read_tokens(state_dir).items()})
        _DIGESTS[path] = cached
    return cached[1]
