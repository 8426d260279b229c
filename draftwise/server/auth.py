"""API keys: `Authorization: Bearer <key>` on every /v1/ route, and on /metrics and /health too
with `protect_metrics`; a missing or wrong key is a 401 in OpenAI's error shape.

Keys come from `--api-key` (repeatable), `--api-key-file` (one a line, `#` comments) and the
DRAFTWISE_API_KEY environment variable. A presented key is compared with every key, each as its
SHA-256 digest with hmac.compare_digest, so the time taken says neither which key nor how much of
one matched, nor its length.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
from collections.abc import Callable

from starlette.datastructures import Headers

from draftwise.server.errors import error_response

ENV = "DRAFTWISE_API_KEY"


def load_keys(keys: list[str] | None = None, files: list[str] | None = None, env=os.environ) -> tuple[str, ...]:
    """The API keys from flags, key files and the environment, in that order, without repeats."""
    found = list(keys or [])
    for path in files or []:
        with open(path, encoding="utf-8") as f:
            found += [s for line in f if (s := line.strip()) and not s.startswith("#")]
    if env.get(ENV, "").strip():
        found.append(env[ENV].strip())
    if any(not k or k != k.strip() for k in found):
        raise ValueError("an API key is empty or starts or ends with whitespace")
    return tuple(dict.fromkeys(found))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class KeyCheck:
    def __init__(self, keys: tuple[str, ...]):
        self._digests = [_digest(k) for k in keys]

    def ok(self, authorization: str | None) -> bool:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        d = _digest(token.strip())
        return any([hmac.compare_digest(d, k) for k in self._digests])  # a list: every key is compared


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


class BearerAuth:
    """ASGI middleware: a 401 before routing, parsing or reading the body of an unauthorised request."""

    def __init__(self, app, keys: KeyCheck, protect_metrics: bool, reject: Callable[[str], None]):
        self.app, self.keys, self.reject, self.protect_metrics = app, keys, reject, protect_metrics

    def guarded(self, path: str) -> bool:
        return path == "/v1" or path.startswith("/v1/") or (self.protect_metrics and path in ("/metrics", "/health"))

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.guarded(scope["path"]) \
                and not self.keys.ok(Headers(scope=scope).get("authorization")):
            self.reject("unauthorized")
            response = error_response(401, "missing or wrong API key: send the header "
                                           "'Authorization: Bearer <key>'", headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def document(app) -> None:
    """Declare the bearer scheme in the OpenAPI schema, on the routes it guards."""
    base = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = base()
            schema.setdefault("components", {})["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            for path, ops in schema["paths"].items():
                if path.startswith("/v1/"):
                    for op in ops.values():
                        op["security"] = [{"bearer": []}]
        return app.openapi_schema
    app.openapi = openapi
