"""The replica's network edge: its inter-deployment gRPC server on loopback, the API keys (the deployment's and
the per-user ones of `serve.user_keys_file`), and the body checks every /v1 route runs before anything else (size,
JSON, depth, Unicode)."""

from __future__ import annotations

import hmac
import json
import re
from pathlib import Path

from fastapi import Request

from serve.wire import MAX_DEPTH, check_json, error


def loopback_replica_grpc() -> None:
    """Ray Serve 2.60 starts each replica's inter-deployment gRPC server on "[::]:0", every interface, once
    the deployment's __init__ has run. Everything of ours listens on loopback: bind it to 127.0.0.1 (the
    replica and its callers are on this node)."""
    import ray.serve._private.replica as replica

    bind = replica.add_port_to_grpc_server
    if getattr(bind, "loopback", False):
        return

    def loopback(server, address: str):
        return bind(server, address.replace("[::]", "127.0.0.1", 1))

    loopback.loopback = True
    replica.add_port_to_grpc_server = loopback


def _bearer(request: Request) -> bytes | None:
    """The token of `Authorization: Bearer <token>`; the scheme's name in any case (RFC 7235: "bearer" is "Bearer")."""
    scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
    return token.strip().encode() if scheme.lower() == "bearer" and token.strip() else None


def authorized(request: Request, key: str) -> bool:
    """The request bears `key` (the deployment's: the page and /metrics take no other)."""
    token = _bearer(request)
    return token is not None and hmac.compare_digest(token, key.encode())


USER_KEY_NAME = re.compile(r"[A-Za-z0-9_.@+-]{1,64}")
MIN_USER_KEY = 16


def load_user_keys(path: str | Path | None, main: str) -> dict[str, str]:
    """`serve.user_keys_file`: one `name key` a line (blank lines and `#` comments skipped) -> {key: name}. A clear
    ValueError, naming the line, for a malformed line, a name outside [A-Za-z0-9_.@+-]{1,64}, a key shorter than 16
    characters, a name or key given twice, or the deployment's own key."""
    if not path:
        return {}
    keys, names = {}, set()
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        where = f"{path}, line {n}"
        if len(parts) != 2:
            raise ValueError(f"{where}: expected `name key`, got {len(parts)} fields")
        name, key = parts
        if not USER_KEY_NAME.fullmatch(name):
            raise ValueError(f"{where}: the name must be 1-64 of A-Z a-z 0-9 _ . @ + -")
        if len(key) < MIN_USER_KEY:
            raise ValueError(f"{where}: the key of {name!r} is shorter than {MIN_USER_KEY} characters")
        if name in names or key in keys:
            raise ValueError(f"{where}: {'the name ' + repr(name) if name in names else 'that key'} is given twice")
        if hmac.compare_digest(key.encode(), main.encode()):
            raise ValueError(f"{where}: the key of {name!r} is the deployment's own key (serve.api_key)")
        keys[key], names = name, names | {name}
    return keys


class Keys:
    """Who bears a request's key: "" for the deployment's key (whose clients name their users by `user`), the name
    of a per-user key of `serve.user_keys_file`, None for no known key. Every key is compared, in constant time."""

    def __init__(self, main: str, users: dict[str, str] | None = None):
        self.main, self.users = main.encode(), {k.encode(): name for k, name in (users or {}).items()}

    def holder(self, request: Request) -> str | None:
        token = _bearer(request)
        if token is None:
            return None
        found = "" if hmac.compare_digest(token, self.main) else None
        for key, name in self.users.items():
            if hmac.compare_digest(token, key):
                found = name
        return found


def unauthorized():
    return error(401, "missing or invalid API key (Authorization: Bearer <key>)", "authentication_error", code="invalid_api_key")


async def read_body(request: Request, keys: Keys, max_bytes: int):
    """(body, None) or (None, the error response): 401 without a known key, 413 over `max_bytes`, 400 for JSON that
    does not parse, is nested too deep or holds lone surrogates."""
    if keys.holder(request) is None:
        return None, unauthorized()
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        return None, error(413, f"request body larger than {max_bytes} bytes")
    raw = await request.body()
    if len(raw) > max_bytes:
        return None, error(413, f"request body larger than {max_bytes} bytes")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return None, error(400, f"body is not valid JSON: {exc}")
    except RecursionError:
        return None, error(400, f"body is nested deeper than {MAX_DEPTH} levels")
    if problem := check_json(body):
        return None, error(400, problem)
    return body, None
