"""The HTTP layer: parse an OpenAI request, hand it to the scheduler, format what comes back.

Handlers never touch a model: the scheduler thread owns the runners. Each request gets an
asyncio queue; the scheduler delivers Chunks into it with call_soon_threadsafe. A request is
cancelled (its KV state freed at the scheduler's next step) when its handler exits early: the
client disconnected, or the stream could not be written.
"""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from draftwise.sampling import SamplingParams
from draftwise.scheduler import QueueFull, Request, Scheduler
from draftwise.server.metrics import ServerMetrics
from draftwise.server.responses import Formatter, sse
from draftwise.server.schemas import ChatCompletionRequest, CompletionRequest, ErrorResponse, error_json

_ERRORS = {400: {"model": ErrorResponse, "description": "Invalid request"},
           429: {"model": ErrorResponse, "description": "Queue full"}}
_POLL_S = 0.25  # how often a waiting handler checks that its client is still there


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def create_app(scheduler: Scheduler, tokenizer, model_name: str, metrics: ServerMetrics) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        yield
        scheduler.close()

    app = FastAPI(title="draftwise", version="0.1.0", lifespan=lifespan)
    app.state.scheduler, app.state.metrics = scheduler, metrics

    @app.exception_handler(ApiError)
    async def _api_error(request, e: ApiError):
        metrics.reject({400: "invalid", 429: "queue_full"}.get(e.status, str(e.status)))
        return JSONResponse(error_json(e.status, e.message, e.param), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, e: RequestValidationError):
        errs = e.errors()
        where = ".".join(str(x) for x in errs[0]["loc"][1:]) if errs else None
        msg = "; ".join(f"{'.'.join(str(x) for x in er['loc'][1:]) or 'body'}: {er['msg']}" for er in errs[:3])
        metrics.reject("invalid")
        return JSONResponse(error_json(400, msg or "invalid request", where or None), status_code=400)

    @app.get("/health")
    async def health() -> dict:
        waiting, running = scheduler.counts()
        return {"status": "ok", "waiting": waiting, "running": running}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "draftwise", "max_model_len": scheduler.target.max_context}]}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus() -> PlainTextResponse:
        metrics.queue(*scheduler.counts())
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions", responses=_ERRORS)
    async def completions(body: CompletionRequest, http: HttpRequest):
        _check(body, model_name)
        ids = list(body.prompt) if isinstance(body.prompt, list) else tokenizer.encode(body.prompt)
        return await _serve(body, ids, Formatter(model_name, False, body.return_token_ids), http)

    @app.post("/v1/chat/completions", responses=_ERRORS)
    async def chat_completions(body: ChatCompletionRequest, http: HttpRequest):
        _check(body, model_name)
        if body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        msgs, prefix = body.chat()
        try:
            ids = tokenizer.apply_chat(msgs, prefix)
        except Exception as e:  # a template that rejects these messages (e.g. roles out of order)
            raise ApiError(400, f"the chat template rejected the messages: {e}", "messages") from None
        return await _serve(body, ids, Formatter(model_name, True, body.return_token_ids), http)

    async def _serve(body, ids: list[int], fmt: Formatter, http: HttpRequest):
        max_tokens = body.max_tokens
        if max_tokens is None:  # chat: up to the context
            max_tokens = max(1, scheduler.target.max_context - len(ids) - scheduler.max_draft)
        try:
            params = SamplingParams(body.temperature, body.top_p, body.top_k, body.seed)
            logprobs = body.logprobs_k()
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        if logprobs is not None:
            fmt.piece = lambda t: tokenizer.decode([t])
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        req = Request(ids, max_tokens, params, lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev),
                      body.stop_list(), body.draft_tokens(), logprobs=logprobs)
        try:
            scheduler.submit(req)
        except QueueFull as e:
            raise ApiError(429, str(e)) from None
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            # the background task runs when the stream ends or the client leaves, even before the
            # generator's first step (where its own `finally` would not run)
            return StreamingResponse(_stream(req, events, fmt, usage, http), media_type="text/event-stream",
                                     background=BackgroundTask(req.cancel))
        try:
            while True:
                ev = await _next(events, http)
                if ev is None:  # the client has gone: nobody to answer
                    return Response(status_code=499)
                if isinstance(ev, BaseException):
                    return JSONResponse(error_json(500, f"generation failed: {ev}"), status_code=500)
                if ev.result is not None:
                    return fmt.whole(ev.result)
        finally:
            req.cancel()  # no-op once finished; frees the KV state of a client that left

    async def _stream(req: Request, events: asyncio.Queue, fmt: Formatter, usage: bool, http: HttpRequest):
        try:
            if (first := fmt.first_chunk()) is not None:
                yield first
            while True:
                ev = await _next(events, http)
                if ev is None:
                    return
                if isinstance(ev, BaseException):
                    yield sse(error_json(500, f"generation failed: {ev}"))
                    break
                if (out := fmt.chunk(ev)) is not None:
                    yield out
                if ev.result is not None:
                    if usage:
                        yield fmt.usage_chunk(ev.result)
                    break
            yield sse("[DONE]")
        finally:
            req.cancel()

    return app


async def _next(events: asyncio.Queue, http: HttpRequest):
    """The next scheduler event, or None once the client has disconnected."""
    while True:
        try:
            return await asyncio.wait_for(events.get(), _POLL_S)
        except asyncio.TimeoutError:
            if await http.is_disconnected():
                return None


def _check(body, model_name: str) -> None:
    if body.model != model_name:
        raise ApiError(400, f"model {body.model!r} is not served here; this server serves {model_name!r}",
                       "model")
    bad = body.unsupported()
    if bad:
        raise ApiError(400, f"not implemented by draftwise: {', '.join(bad)} (leave at the default)", bad[0])
