"""Predicted Outputs over loopback HTTP on the toy runner: `prediction` on completions and chat
(the official openai client, streaming and not), usage.completion_tokens_details counted exactly,
and bad predictions answered with a 400 naming the problem."""
import json

import openai
import pytest

from draftwise.build import with_prediction
from draftwise.drafters.ngram import NgramDrafter
from draftwise.policy import FixedDraftLength
from draftwise.scheduler import Scheduler
from draftwise.server.load import Tokenizers
from serving import ChatChars, LiveServer, Runner

MODEL = "toy"


def build(cfg, observer):
    """The toy runner (next char after t: t + 1, no EOS) with n-gram drafting composed with the prediction."""
    tok = ChatChars()
    sched = Scheduler(Runner(period=15), tok, with_prediction(NgramDrafter(1, 3)), FixedDraftLength(4),
                      max_running=4, max_queue=cfg.max_queue, observer=observer, reserve_draft=False)
    return sched, Tokenizers(tok)


@pytest.fixture(scope="module")
def srv():
    s = LiveServer(build, model_name=MODEL)
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


# "abc" continues "defghi"; the prediction "defaaghi" inserts "aa": its 6 other tokens appear
PREDICTION = {"type": "content", "content": "defaaghi"}
DETAILS = {"accepted_prediction_tokens": 6, "rejected_prediction_tokens": 2}


def complete(srv, **body):
    return srv.post("/v1/completions", json={"model": MODEL, "prompt": "abc", "max_tokens": 6, "temperature": 0,
                                             **body})


def test_completions_count_the_prediction_tokens_in_the_completion(srv):
    r = complete(srv, prediction=PREDICTION)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["text"] == "defghi"
    assert body["usage"]["completion_tokens_details"] == DETAILS
    plain = complete(srv).json()  # without a prediction: usage as before
    assert plain["choices"][0]["text"] == "defghi" and "completion_tokens_details" not in plain["usage"]


def test_the_streamed_usage_chunk_counts_them_too(srv):
    r = complete(srv, prediction=PREDICTION, stream=True, stream_options={"include_usage": True})
    events = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: ") and x != "data: [DONE]"]
    assert "".join(c["choices"][0]["text"] for c in events if c["choices"]) == "defghi"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens_details"] == DETAILS


def test_openai_client_chat_with_prediction_stream_and_not(client):
    msgs = [{"role": "user", "content": "abc"}]
    whole = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, temperature=0,
                                           prediction=PREDICTION)
    assert whole.choices[0].message.content == "defghi"
    d = whole.usage.completion_tokens_details
    assert (d.accepted_prediction_tokens, d.rejected_prediction_tokens) == (6, 2)
    parts = {"type": "content", "content": [{"type": "text", "text": "defg"}, {"type": "text", "text": "mno"}]}
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, temperature=0,
                                                 prediction=parts, stream=True,
                                                 stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "defghi"
    d = chunks[-1].usage.completion_tokens_details  # "defg" + "mno": m, n, o never appear
    assert (d.accepted_prediction_tokens, d.rejected_prediction_tokens) == (4, 3)
    text = client.completions.create(model=MODEL, prompt="abc", max_tokens=6, temperature=0,
                                     extra_body={"prediction": PREDICTION})
    assert text.usage.completion_tokens_details.accepted_prediction_tokens == 6


@pytest.mark.parametrize("path, prediction, words", [
    ("/v1/completions", {"type": "text", "content": "def"}, "prediction.type: Input should be 'content'"),
    ("/v1/completions", {"type": "content", "content": 3}, "prediction.content"),
    ("/v1/completions", {"type": "content", "content": [{"type": "text", "text": "d"}]}, "prediction.content"),
    ("/v1/completions", "defghi", "prediction"),
    ("/v1/chat/completions", {"content": "def"}, "prediction.type: Field required"),
    ("/v1/completions", {"type": "content", "content": "a" * 600},
     "prompt (3 tokens) + prediction (600 tokens) = 603 exceeds the context of 512 tokens; send a shorter prediction"),
    ("/v1/chat/completions", {"type": "content", "content": "dez"}, "prediction token ids out of range [0, 16): [25]"),
])
def test_bad_predictions_are_a_400_naming_the_problem(srv, path, prediction, words):
    body = {"model": MODEL, "max_tokens": 4, "prediction": prediction}
    body |= {"prompt": "abc"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "abc"}]}
    r = srv.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert words in err["message"] and err["param"] == "prediction", err
