"""draftwise serve: an OpenAI-compatible HTTP server over the batched speculative scheduler.

    schemas.py    request bodies, refused parameters, the field checks
    responses.py  response objects and SSE chunks
    errors.py     OpenAI's error object for every error
    auth.py       API keys (Bearer), checked in constant time
    metrics.py    Prometheus metrics (vLLM names) = the scheduler's observer
    load.py       ServeConfig -> runners, drafter, Scheduler; the HTTP side's tokenizers
    lifecycle.py  loading in the background, health, drain on SIGTERM
    app.py        the FastAPI routes
"""
from __future__ import annotations

from draftwise.server.load import ServeConfig


def build_app(cfg: ServeConfig, build=None):
    """A FastAPI app; its startup loads the scheduler in a background thread (`build(cfg, observer)`
    -> (scheduler, tokenizers); default: the spec's models) and its shutdown closes it."""
    from draftwise.server.app import create_app
    from draftwise.server.lifecycle import Lifecycle
    from draftwise.server.load import build_scheduler
    from draftwise.server.metrics import ServerMetrics

    metrics = ServerMetrics(cfg.model_name)
    build = build or build_scheduler
    return create_app(Lifecycle(lambda: build(cfg, metrics), cfg.stall_timeout), cfg, metrics)


def make_server(app, cfg: ServeConfig, **uvicorn_kw):
    """uvicorn's server for the app, draining the scheduler on shutdown (SIGTERM)."""
    import uvicorn

    from draftwise.server.lifecycle import DrainingServer

    # uvicorn's own deadline for open connections: after the drain has failed what was left
    config = uvicorn.Config(app, timeout_graceful_shutdown=cfg.drain_timeout + 5, **uvicorn_kw)
    server = DrainingServer(config, app.state.life, cfg.drain_timeout)
    app.state.life.on_failure = lambda: setattr(server, "should_exit", True)
    return server


def serve(cfg: ServeConfig, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning") -> int:
    """Run until SIGTERM / SIGINT; the exit status (1 if the model failed to load)."""
    app = build_app(cfg)
    make_server(app, cfg, host=host, port=port, log_level=log_level).run()
    return 1 if app.state.life.state == "failed" else 0


__all__ = ["ServeConfig", "build_app", "make_server", "serve"]
