"""draftwise serve: an OpenAI-compatible HTTP server over the batched speculative scheduler.

    schemas.py    request bodies, refused parameters, the error object
    responses.py  response objects and SSE chunks
    metrics.py    Prometheus metrics (vLLM names) = the scheduler's observer
    load.py       ServeConfig -> runners, drafter, Scheduler
    app.py        the FastAPI routes
"""
from __future__ import annotations

from draftwise.server.load import ServeConfig


def build_app(cfg: ServeConfig):
    """A FastAPI app with its scheduler thread started (stopped by the app's shutdown)."""
    from draftwise.server.app import create_app
    from draftwise.server.load import build_scheduler
    from draftwise.server.metrics import ServerMetrics

    metrics = ServerMetrics(cfg.model_name)
    scheduler, tok = build_scheduler(cfg, observer=metrics)
    scheduler.start()
    return create_app(scheduler, tok, cfg.model_name, metrics)


def serve(cfg: ServeConfig, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning") -> None:
    import uvicorn

    uvicorn.run(build_app(cfg), host=host, port=port, log_level=log_level)


__all__ = ["ServeConfig", "build_app", "serve"]
