"""The request body's size limit, checked before anything reads or parses the body."""
from __future__ import annotations

from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException

from draftwise.server.errors import error_response


class BodyTooLarge(HTTPException):
    """Raised while the body arrives; the app's HTTP error handler answers the 413."""

    def __init__(self, limit: int):
        super().__init__(413, f"the request body is larger than this server's limit of {limit} bytes "
                              "(--max-body-bytes)")


class BodyLimit:
    """ASGI middleware: a 413 for a body over `max_bytes`, at once by its Content-Length, else as
    soon as the bytes received pass the limit (a chunked body)."""

    def __init__(self, app, max_bytes: int, reject: Callable[[str], None]):
        self.app, self.max_bytes, self.reject = app, max_bytes, reject

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = Headers(scope=scope).get("content-length", "")
        if length.isdigit() and int(length) > self.max_bytes:
            self.reject("too_large")
            e = BodyTooLarge(self.max_bytes)
            return await error_response(413, e.detail)(scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message
        await self.app(scope, counted, send)
