"""The replica's network edge: its inter-deployment gRPC server on loopback, the API key, and the body
checks every /v1 route runs before anything else (size, JSON, depth, Unicode)."""

from __future__ import annotations

import hmac
import json

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


def authorized(request: Request, key: str) -> bool:
    """`Authorization: Bearer <key>`; the scheme's name in any case (RFC 7235: "bearer" is "Bearer")."""
    scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
    return scheme.lower() == "bearer" and bool(token.strip()) and hmac.compare_digest(token.strip().encode(), key.encode())


def unauthorized():
    return error(401, "missing or invalid API key (Authorization: Bearer <key>)", "authentication_error", code="invalid_api_key")


async def read_body(request: Request, key: str, max_bytes: int):
    """(body, None) or (None, the error response): 401 without the key, 413 over `max_bytes`, 400 for JSON that
    does not parse, is nested too deep or holds lone surrogates."""
    if not authorized(request, key):
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
