"""Schemathesis against the server's own OpenAPI schema (/openapi.json), over loopback HTTP with an
API key: whatever it sends, valid or not, the server answers without a server error (bad input is
a 400, never a 5xx), every error in OpenAI's shape, and the scheduler thread survives with no
sequence left open."""
import os
import time

import pytest

schemathesis = pytest.importorskip("schemathesis")
pytest.importorskip("llama_cpp")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402

from serving import LiveServer  # noqa: E402

EXAMPLES = int(os.environ.get("DRAFTWISE_FUZZ_EXAMPLES", 20))  # per operation and mode


@pytest.fixture(scope="module")
def live():
    s = LiveServer(max_context=128, max_queue=256, api_keys=("fuzz-key",))  # a short context bounds every request
    yield s
    s.close()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_server_error(live, mode):
    # (schemathesis' own pytest plugin does not run under pytest 9: hypothesis drives it here)
    schema = schemathesis.openapi.from_url(live.url + "/openapi.json")
    ops = [r.ok() for r in schema.get_all_operations()]
    assert {op.path for op in ops} >= {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health"}
    seen = []
    for op in ops:
        if mode == GenerationMode.NEGATIVE and op.method.upper() != "POST":
            continue  # nothing to get wrong in a GET without parameters
        strategy = op.as_strategy(generation_mode=mode)
        if mode == GenerationMode.POSITIVE and op.method.upper() == "POST":
            strategy = strategy.map(_served_model)  # else nearly every case stops at "unknown model"

        @given(case=strategy)
        @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def check(case):
            response = case.call(base_url=live.url, timeout=60, headers=live.headers())
            seen.append(response.status_code)
            assert response.status_code < 500, \
                f"{case.method} {case.path} {case.body!r} -> {response.status_code}: {response.text[:300]}"
            if response.status_code >= 400:
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}
        check()
    assert live.life.loop.alive()
    assert 200 in seen or mode == GenerationMode.NEGATIVE
    assert 401 not in seen or mode == GenerationMode.NEGATIVE  # negative cases may break the key itself
    deadline = time.time() + 30
    while any(live.scheduler.counts()) and time.time() < deadline:
        time.sleep(0.05)
    assert live.scheduler.sequences_held == 0 and live.scheduler.target._lengths == {}


def _served_model(case):
    """The served model, and at most 8 new tokens: the point is the HTTP layer, not generation."""
    if isinstance(case.body, dict):
        case.body["model"] = "smollm2-135m"
        for k in ("max_tokens", "max_completion_tokens"):
            if isinstance(case.body.get(k), int):
                case.body[k] = min(case.body[k], 8)
        if "messages" in case.body and case.body.get("max_completion_tokens") is None:
            case.body["max_tokens"] = min(case.body.get("max_tokens") or 8, 8)
    return case
