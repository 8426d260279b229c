"""`response_format` and `tools` on chat completions: the request checks, tool calls read back
from the template's <tool_call> format (whole and streamed), and, on the packaged
Qwen2.5-Coder-0.5B through the official openai client, answers held to the schema and to the
tools, streaming and not."""
import json

import openai
import pytest

from draftwise.server.tools import (BadRequest, CallStream, parse_choice, parse_tools, read_calls,
                                    tool_grammar, format_schema)
from serving import LiveServer

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}


# --- the request checks -------------------------------------------------------------------------

@pytest.mark.parametrize("tools, words", [
    ([{"type": "retrieval"}], "must be {\"type\": \"function\""),
    ([{"type": "function", "function": {"name": "has space"}}], "letters, digits"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}], "schema of an object"),
    ([{"type": "function", "function": {"name": "f", "parameters": "city"}}], "schema of an object"),
    ([WEATHER, WEATHER], "a second function named 'get_weather'"),
])
def test_bad_tools_name_the_problem(tools, words):
    with pytest.raises(BadRequest) as e:
        parse_tools(tools)
    assert words in str(e.value) and e.value.param == "tools"


def test_tool_choice_forms():
    tools = parse_tools([WEATHER, TIME])
    assert parse_choice(None, tools) == "auto" and parse_choice(None, []) == "none"
    assert parse_choice({"type": "function", "function": {"name": "get_time"}}, tools).name == "get_time"
    for bad, words in (({"type": "function", "function": {"name": "nope"}}, "not among the tools"),
                       ("sometimes", "must be none, auto, required"), ("required", None)):
        with pytest.raises(BadRequest) as e:
            parse_choice(bad, tools if words else [])
        assert e.value.param == "tool_choice" and (words is None or words in str(e.value))


def test_response_format_forms():
    assert format_schema(None) is None and format_schema({"type": "text"}) is None
    assert format_schema({"type": "json_object"}) == {"type": "object"}
    s = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert format_schema({"type": "json_schema", "json_schema": {"name": "x", "schema": s, "strict": True}}) == s
    for bad in ({"type": "xml"}, {"type": "json_schema"}, {"type": "json_schema", "json_schema": {"schema": 3}}):
        with pytest.raises(BadRequest) as e:
            format_schema(bad)
        assert e.value.param == "response_format"


def test_grammar_names_only_the_chosen_tool_and_text_only_under_auto():
    tools = parse_tools([WEATHER, TIME])
    named = tool_grammar(tools, tools[1], 7, 8, parallel=False)
    assert '"get_time"' in named and "get_weather" not in named and "TEXT" not in named and ")*" not in named
    auto = tool_grammar(tools, "auto", 7, 8)
    assert "<[7]>" in auto and "<[8]>" in auto and "start: calls | bare | fenced | TEXT" in auto and ")*" in auto
    assert "TEXT: /[^<{`]" in auto  # text opens with neither a tag, a bare call's brace nor a fenced call


def test_under_auto_a_call_may_be_tagged_bare_or_fenced_and_text_opens_as_none_of_them():
    pytest.importorskip("llguidance")
    from draftwise.grammar import Grammars
    from draftwise.models.load import load_tokenizer
    from draftwise.models.registry import resolve

    tok = load_tokenizer(resolve("qwen2.5-coder-0.5b"))
    tools = parse_tools([WEATHER, TIME])
    g = Grammars(tok, 151936).lark(tool_grammar(tools, "auto", *tok.tool_call_tokens()))

    def takes(text: str) -> bool:
        c = g.start()
        try:
            c.advance(tok.encode(text))
        except RuntimeError:
            return False
        return c.m.is_accepting()
    call = '{"name": "get_time", "arguments": {"zone": "UTC"}}'
    assert takes(call) and takes(f"```json\n{call}\n```") and takes(f"```json\n{call}\n```\n")
    assert takes("It is sunny.") and takes("```python\nprint(1)\n```") and takes("```json\n[1, 2]\n```")
    assert not takes('```json\n{"a": 1}\n```') and not takes('{"a": 1}')  # a call's opening must be a call
    assert not takes('```json\n{"name": "get_time", "arguments": {"zone": 3}}\n```')  # held to its schema


# --- reading calls back -------------------------------------------------------------------------

ANSWER = ('Checking both.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
          '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>')


def test_read_calls_splits_content_and_calls():
    content, calls = read_calls(ANSWER)
    assert content == "Checking both."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_time", {"zone": "CET"})]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert read_calls("no calls <tool_call> {broken") == ("no calls <tool_call> {broken", [])
    content, calls = read_calls(' {"name": "get_time", "arguments": {"zone": "UTC"}}')  # a call without its tags
    assert content is None and [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == \
        [("get_time", '{"zone": "UTC"}')]
    assert read_calls('{"name": "x", "colour": "red"}')[1] == []  # other keys: content
    content, calls = read_calls('```json\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n```\n')  # fenced
    assert content is None and [c["function"]["name"] for c in calls] == ["get_time"]
    assert read_calls("```python\nx = 1\n```") == ("```python\nx = 1\n```", [])


def test_a_streamed_bare_call_is_held_to_the_end():
    s = CallStream()
    assert s.feed('{"name": "get_time", ') == ("", []) and s.feed('"arguments": {}}') == ("", [])
    rest, last = s.flush()
    assert rest == "" and [(d["index"], d["function"]["name"]) for d in last] == [(0, "get_time")]
    s = CallStream()
    s.feed('{"a": 1}')
    assert s.flush() == ('{"a": 1}', [])  # JSON that is no call: content
    s = CallStream()  # a fenced call: held from its first backtick
    assert s.feed("``") == ("", []) and s.feed('`json\n{"name": "get_time", "arguments": {}}\n```') == ("", [])
    assert [d["function"]["name"] for d in s.flush()[1]] == ["get_time"]
    s = CallStream()  # a fenced block of code: sent once it opens otherwise
    assert s.feed("``") == ("", []) and s.feed("`python\nx = 1") == ("```python\nx = 1", [])


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_a_stream_sends_content_until_a_call_opens_and_each_call_whole(step):
    s, content, deltas = CallStream(), "", []
    for i in range(0, len(ANSWER), step):
        text, got = s.feed(ANSWER[i:i + step])
        assert "<" not in text  # never a piece of a tag
        content, deltas = content + text, deltas + got
    rest, last = s.flush()
    content += rest
    assert content == "Checking both.\n" and last == []  # the newline between the two calls is content, as sent
    assert [(d["index"], d["function"]["name"]) for d in deltas] == [(0, "get_weather"), (1, "get_time")]


# --- a real model through the openai client -------------------------------------------------------

@pytest.fixture(scope="module")
def srv():
    s = LiveServer(target="qwen2.5-coder-0.5b", max_context=1024, model_name="q")
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)


ASK = [{"role": "user", "content": "What is the weather in Paris right now, in celsius?"}]


@pytest.mark.slow
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}, "auto"])
def test_tool_calls_come_back_parsed(client, choice):
    r = client.chat.completions.create(model="q", messages=ASK, tools=[WEATHER, TIME], tool_choice=choice,
                                       temperature=0, max_tokens=80)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls", msg
    call = msg.tool_calls[0]
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert set(args) == {"city", "unit"} and isinstance(args["city"], str) and args["unit"] in ("celsius", "fahrenheit")


@pytest.mark.slow
def test_streamed_tool_calls_equal_the_whole_answer(client):
    kw = dict(model="q", messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=80)
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls
    calls, finish = {}, None
    for ch in client.chat.completions.create(stream=True, **kw):
        for d in ch.choices[0].delta.tool_calls or []:
            c = calls.setdefault(d.index, {"name": "", "arguments": ""})
            c["name"] += d.function.name or ""
            c["arguments"] += d.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == \
           [(t.function.name, json.loads(t.function.arguments)) for t in whole]


@pytest.mark.slow
def test_a_tool_result_turn_is_answered_in_text(client):
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}
    msgs = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18, "sky": "clear"}'}]
    # tool_choice none: the answer is text (the 0.5B model would call again), the history still rendered
    r = client.chat.completions.create(model="q", messages=msgs, tools=[WEATHER], tool_choice="none", temperature=0,
                                       max_tokens=40)
    assert r.choices[0].message.tool_calls is None and "18" in r.choices[0].message.content


PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "languages": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "languages"], "additionalProperties": False}


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_answers_follow_the_schema(client, stream):
    kw = dict(model="q", temperature=0, max_tokens=120,
              messages=[{"role": "user", "content": "Ada Lovelace, 36, wrote in English and French. As JSON."}],
              response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                                      "strict": True}})
    if stream:
        text = "".join(ch.choices[0].delta.content or "" for ch in client.chat.completions.create(stream=True, **kw))
    else:
        text = client.chat.completions.create(**kw).choices[0].message.content
    obj = json.loads(text)
    assert set(obj) == set(PERSON["properties"]) and isinstance(obj["name"], str) and isinstance(obj["age"], int)
    assert all(isinstance(x, str) for x in obj["languages"])


@pytest.mark.slow
def test_json_object_and_a_cut_answer(client):
    kw = dict(model="q", temperature=0, messages=[{"role": "user", "content": "Describe Paris as JSON."}],
              response_format={"type": "json_object"})
    r = client.chat.completions.create(max_tokens=200, **kw)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    cut = client.chat.completions.create(max_tokens=5, **kw)
    assert cut.choices[0].finish_reason == "length"


@pytest.mark.slow
@pytest.mark.parametrize("body, param, words", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]}, "tools",
     "schema of an object"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format", "json_schema"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice",
     "not among the tools"),
])
def test_bad_structured_requests_are_400s_naming_the_parameter(srv, body, param, words):
    r = srv.post("/v1/chat/completions", json={"model": "q", "messages": ASK, "max_tokens": 8, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err
