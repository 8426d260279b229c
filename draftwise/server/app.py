"""The HTTP layer: parse an OpenAI request, hand it to the scheduler, format what comes back.

Handlers never touch a model: the scheduler thread owns the runners. Each request gets an
asyncio queue; the scheduler delivers Chunks into it with call_soon_threadsafe. A request is
cancelled (its KV state freed at the scheduler's next step) when its handler exits early: the
client disconnected, or the stream could not be written. Prompts are tokenised off the event loop.
"""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from draftwise.extras import MissingExtra
from draftwise.request import Request, check_prediction
from draftwise.sampling import SamplingParams
from draftwise.scheduler import Scheduler
from draftwise.server import auth, errors
from draftwise.server.errors import ApiError, error_json
from draftwise.server.lifecycle import Lifecycle
from draftwise.server.limits import BodyLimit
from draftwise.server.load import ServeConfig
from draftwise.server.metrics import ServerMetrics
from draftwise.server.responses import Formatter, sse
from draftwise.server.schemas import ChatCompletionRequest, CompletionRequest, ErrorResponse
from draftwise.server.tools import BadRequest, Structured, structured
from draftwise.waiting import QueueFull, ShuttingDown

_ERRORS = {code: {"model": ErrorResponse, "description": text} for code, text in (
    (400, "Invalid request"), (401, "Missing or wrong API key"), (413, "Body too large"), (429, "Queue full"),
    (503, "Loading or shutting down"))}
_POLL_S = 0.25  # how often a waiting handler checks that its client is still there


def create_app(life: Lifecycle, cfg: ServeConfig, metrics: ServerMetrics) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        life.start()  # the port binds now; /health says loading until the scheduler runs
        yield
        life.close()

    app = FastAPI(title="draftwise", version="0.1.0", lifespan=lifespan)
    app.state.life, app.state.metrics = life, metrics
    errors.install(app, metrics.reject)
    app.add_middleware(BodyLimit, max_bytes=cfg.max_body_bytes, reject=metrics.reject)
    if cfg.api_keys:  # added last: runs first
        app.add_middleware(auth.BearerAuth, keys=auth.KeyCheck(cfg.api_keys), protect_metrics=cfg.protect_metrics,
                           reject=metrics.reject)
        auth.document(app)
    model_name = cfg.model_name

    @app.get("/health")
    async def health() -> JSONResponse:
        status, body = life.health()
        return JSONResponse(body, status_code=status)

    @app.get("/v1/models", responses=_ERRORS)
    async def models() -> dict:
        sched, _ = life.serving()
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "draftwise", "max_model_len": sched.target.max_context}]}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus() -> PlainTextResponse:
        if (sched := life.scheduler) is not None:
            metrics.queue(*sched.counts())
            metrics.held(sched.sequences_held)
            if sched.drafter is not None:
                metrics.drafter_state(sched.drafter.memory_nodes())
            if (cache := sched.prompt_cache) is not None:
                metrics.prompt_cache(cache.bytes, len(cache))
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions", responses=_ERRORS)
    async def completions(body: CompletionRequest, http: HttpRequest):
        sched, toks = life.serving()
        _check(body, cfg)
        if isinstance(body.prompt, list):
            ids = list(body.prompt)
        else:
            ids = await _tokenised(toks.encode(body.prompt), "prompt")
        fmt = Formatter(model_name, False, body.return_token_ids, prediction=await _prediction(body, toks))
        return await _serve(sched, toks, body, ids, fmt, http)

    @app.post("/v1/chat/completions", responses=_ERRORS)
    async def chat_completions(body: ChatCompletionRequest, http: HttpRequest):
        sched, toks = life.serving()
        _check(body, cfg)
        if body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        msgs, prefix, generation_prompt = body.chat()
        shape = await _structured(body, toks)
        ids = await _tokenised(toks.apply_chat(msgs, prefix, generation_prompt, shape.tools), "messages")
        fmt = Formatter(model_name, True, body.return_token_ids, prediction=await _prediction(body, toks),
                        tool_calls=shape.reads_calls)
        return await _serve(sched, toks, body, ids, fmt, http, shape.grammar)

    async def _serve(sched: Scheduler, toks, body, ids: list[int], fmt: Formatter, http: HttpRequest, grammar=None):
        if cfg.max_prompt_tokens is not None and len(ids) > cfg.max_prompt_tokens:
            raise ApiError(400, f"the prompt has {len(ids)} tokens; this server takes at most "
                                f"{cfg.max_prompt_tokens}", "messages" if fmt.chat else "prompt")
        try:
            check_prediction(sched.target, ids, fmt.prediction)
        except ValueError as e:
            raise ApiError(400, str(e), "prediction") from None
        max_tokens = body.max_tokens
        if max_tokens is None:  # chat: up to the context
            max_tokens = max(1, sched.target.max_context - len(ids) - sched.reserve)
        try:
            params = SamplingParams(body.temperature, body.top_p, body.top_k, body.seed)
            logprobs = body.logprobs_k()
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        if logprobs is not None:
            fmt.piece = toks.piece
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        req = Request(ids, max_tokens, params, lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev),
                      body.stop_list(), body.draft_tokens(), logprobs=logprobs, private=body.private,
                      prediction=fmt.prediction or None, constraint=grammar)
        try:
            sched.submit(req)
        except QueueFull as e:
            raise ApiError(429, str(e)) from None
        except ShuttingDown as e:
            raise ApiError(503, str(e)) from None
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            # the background task runs when the stream ends or the client leaves, even before the
            # generator's first step (where its own `finally` would not run)
            return StreamingResponse(_stream(req, events, fmt, usage, http), media_type="text/event-stream",
                                     background=BackgroundTask(req.cancel))
        watch = asyncio.create_task(_watch(http, events))
        try:
            while True:
                ev = await events.get()
                if ev is None:  # the client has gone: nobody to answer
                    return Response(status_code=499)
                if isinstance(ev, BaseException):
                    return JSONResponse(_failure(ev), status_code=_failure_status(ev))
                if ev.result is not None:
                    return fmt.whole(ev.result)
        finally:
            watch.cancel()
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
                    yield sse(_failure(ev))
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


async def _watch(http: HttpRequest, events: asyncio.Queue) -> None:
    """Put None on `events` once the client has disconnected: checked every _POLL_S, also while
    the scheduler's chunks keep coming (a whole response sends nothing until the end)."""
    while not await http.is_disconnected():
        await asyncio.sleep(_POLL_S)
    events.put_nowait(None)


async def _structured(body: ChatCompletionRequest, toks) -> Structured:
    """The grammar a chat request's response_format or tools ask for (compiled off the event
    loop), the tools its template renders, and whether its answer is read for tool calls."""
    try:
        return await structured(body.response_format, body.tools, body.tool_choice, body.parallel_tool_calls, toks)
    except BadRequest as e:
        raise ApiError(400, str(e), e.param) from None
    except MissingExtra as e:
        raise ApiError(400, f"structured outputs are not installed on this server: {e}", "response_format") from None
    except ValueError as e:  # the grammar engine refused the schema: its message names the problem
        raise ApiError(400, str(e), "tools" if body.tools and body.tool_choice != "none" else "response_format") \
            from None


async def _prediction(body, toks) -> list[int] | None:
    """The request's prediction as token ids (None: it sent none)."""
    if body.prediction is None:
        return None
    return await _tokenised(toks.encode(body.prediction.text()), "prediction")


async def _tokenised(pending, param: str) -> list[int]:
    try:
        return await pending
    except Exception as e:  # noqa: BLE001 - e.g. a chat template that rejects the roles' order
        what = ("the chat template rejected the messages" if param == "messages"
                else f"the {param} could not be tokenised")
        raise ApiError(400, f"{what}: {e}", param) from None


def _failure_status(error: BaseException) -> int:
    """A request that failed in the scheduler: 503 when the server shuts down, else 500."""
    return 503 if isinstance(error, ShuttingDown) else 500


def _failure(error: BaseException) -> dict:
    what = "cancelled" if isinstance(error, ShuttingDown) else "generation failed"
    return error_json(_failure_status(error), f"{what}: {error}")


def _check(body, cfg: ServeConfig) -> None:
    if body.model != cfg.model_name:
        raise ApiError(400, f"model {body.model!r} is not served here; this server serves {cfg.model_name!r}",
                       "model")
    bad = body.unsupported()
    if bad:
        batch = "; a prompt is one text or one list of token ids, not a list of prompts" if "prompt" in bad else ""
        raise ApiError(400, f"not implemented by draftwise: {', '.join(bad)} (leave at the default{batch})", bad[0])
    stop = body.stop_list()
    if len(stop) > cfg.max_stop or any(len(s) > cfg.max_stop_chars for s in stop):
        raise ApiError(400, f"at most {cfg.max_stop} stop strings of at most {cfg.max_stop_chars} characters "
                            "each", "stop")
