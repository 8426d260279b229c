"""Every error the server answers is OpenAI's error object, `{"error": {message, type, param, code}}`:
the routes' own (ApiError), bodies that fail validation or do not parse (invalid or over-deep
JSON, bytes that are not UTF-8), unknown routes and methods, bodies over the size limit, missing
API keys, and anything unexpected (500, logged)."""
from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

log = logging.getLogger(__name__)
TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
         405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_exceeded",
         503: "service_unavailable"}
REASONS = {400: "invalid", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 413: "too_large",
           429: "queue_full", 503: "unavailable"}  # the `reason` label of draftwise:requests_rejected_total


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def error_json(status: int, message: str, param: str | None = None) -> dict:
    # a message may quote the client's text: never let it make the error itself unencodable
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"error": {"message": message, "type": TYPES.get(status, "server_error"), "param": param,
                      "code": str(status)}}


def error_response(status: int, message: str, param: str | None = None, headers=None) -> JSONResponse:
    return JSONResponse(error_json(status, message, param), status_code=status, headers=headers)


def install(app: FastAPI, reject: Callable[[str], None]) -> None:
    """Answer every error with OpenAI's object; `reject(reason)` counts the client errors."""

    @app.exception_handler(ApiError)
    async def _api(request, e: ApiError):
        reject(REASONS.get(e.status, str(e.status)))
        return error_response(e.status, e.message, e.param)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, e: RequestValidationError):
        reject("invalid")
        errs = e.errors()
        if errs and errs[0]["type"] == "json_invalid":  # loc is ("body", character offset): not a param
            err = errs[0]
            return error_response(400, f"the body is not valid JSON: {err.get('ctx', {}).get('error', '')} "
                                       f"at character {err['loc'][-1]}")
        if errs and tuple(errs[0]["loc"]) == ("body",):  # not an object: say what was sent instead
            kind = request.headers.get("content-type", "").split(";")[0].strip()
            if kind != "application/json":
                return error_response(400, "the body must be a JSON object sent with Content-Type: "
                                           f"application/json, got {kind or 'no Content-Type'}")
            return error_response(400, f"the body must be a JSON object, got {_json_kind(errs[0].get('input'))}")
        return error_response(400, _message(errs) or "invalid request", _param(errs))

    @app.exception_handler(HTTPException)
    async def _http(request, e: HTTPException):
        reject(REASONS.get(e.status_code, str(e.status_code)))
        message = {404: f"no route {request.url.path}",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(e.status_code, str(e.detail))
        return error_response(e.status_code, message, headers=e.headers)

    @app.exception_handler(Exception)
    async def _bug(request, e: Exception):
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=e)
        return error_response(500, f"internal server error ({type(e).__name__})")


# what a union member wanted, by pydantic's error type: "stop: expected a string or a list"
_WANTS = {"string_type": "a string", "list_type": "a list", "int_type": "an integer", "int_parsing": "an integer",
          "float_type": "a number", "float_parsing": "a number", "bool_type": "a boolean", "bool_parsing": "a boolean",
          "dict_type": "an object", "model_type": "an object", "model_attributes_type": "an object"}


def _message(errs: list[dict]) -> str:
    """The errors per field, the field's path without pydantic's union-member tags; a field whose
    union members all refused its type gets one "expected A or B"."""
    by_field: dict[str, list[dict]] = {}
    for er in errs:
        path = ".".join(str(x) for x in er["loc"][1:] if not _member_tag(x)) or "body"
        by_field.setdefault(path, []).append(er)
    parts = []
    for path, es in list(by_field.items())[:3]:
        wants = list(dict.fromkeys(_WANTS.get(e["type"]) for e in es))
        if len(es) > 1 and None not in wants:
            got = _json_kind(es[0].get("input"))
            parts.append(f"{path}: expected {' or '.join(wants)}" + (f", got {got}" if got != "no object" else ""))
        else:
            parts.append("; ".join(f"{path}: {e['msg']}" for e in es))
    return "; ".join(parts)


def _member_tag(x) -> bool:
    """pydantic's name for the union member an error is about (str, list[str], function-after[...],
    constrained-int): never a field name."""
    return isinstance(x, str) and ("[" in x or "-" in x or x in ("str", "int", "float", "bool", "list", "dict"))


def _json_kind(value) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), "no object")


def _param(errs: list[dict]) -> str | None:
    """The top-level field the first error is about (not a union member's type name)."""
    loc = errs[0]["loc"][1:] if errs else ()
    return str(loc[0]) if loc and isinstance(loc[0], str) else None
