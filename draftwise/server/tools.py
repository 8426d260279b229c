"""Structured chat outputs: `response_format` and `tools`, as grammars the loop enforces
(draftwise.grammar) and tool calls read back into OpenAI's `tool_calls`.

The model's own tool-call format comes from its chat template: Qwen2.5 (Hermes-style) templates
render the tools into the system prompt and ask for

    <tool_call>
    {"name": <function-name>, "arguments": <args-json-object>}
    </tool_call>

with `<tool_call>` and `</tool_call>` single tokens. Under `tool_choice` "required" or a named
function the answer is one or more such calls, each JSON object held to the tools' schemas (its
name one of theirs, its arguments that function's `parameters`); under "auto" it is either those
calls (tagged, or one call's JSON alone, as small models write it) or text that opens with neither
"<" nor "{" (or JSON of the response_format's schema, when the request has one); "none" renders no
tools and reads no calls.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from draftwise.grammar import JSON_LAYOUT
from draftwise.grammar import format_schema as grammar_format_schema

NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
OPEN, CLOSE = "<tool_call>", "</tool_call>"  # as draftwise.tokenizer.Tokenizer.tool_call_tokens finds them
FENCE_OPEN, FENCE_CLOSE = "```json\n", "\n```"  # a call's JSON in a fenced block, as small models write one under "auto"
FENCED = re.compile(re.escape(FENCE_OPEN) + "(.*)" + re.escape(FENCE_CLOSE), re.S)


class BadRequest(ValueError):
    """A 400 naming the parameter at fault."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    parameters: dict  # a JSON schema of an object
    spec: dict  # as the client sent it: what the chat template renders


def parse_tools(tools: list[dict] | None) -> list[Tool]:
    """The request's tools, each checked: a function with a valid name and an object schema."""
    out: list[Tool] = []
    for i, t in enumerate(tools or []):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise BadRequest(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}", "tools")
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise BadRequest(f"tools[{i}].function.name must be 1-64 letters, digits, _ or -, got {name!r}", "tools")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise BadRequest(f"tools[{i}].function.parameters must be a JSON schema of an object "
                             f"(\"type\": \"object\"), got {json.dumps(params)[:100]}", "tools")
        if any(o.name == name for o in out):
            raise BadRequest(f"tools[{i}]: a second function named {name!r}", "tools")
        out.append(Tool(name, params, t))
    return out


def parse_choice(choice, tools: list[Tool]) -> str | Tool:
    """"none" | "auto" | "required", or the one Tool a named choice forces."""
    if choice is None:
        return "auto" if tools else "none"
    if choice in ("none", "auto", "required"):
        if choice != "none" and not tools:
            raise BadRequest(f"tool_choice {choice!r} needs tools", "tool_choice")
        return choice
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise BadRequest("tool_choice must be none, auto, required or {\"type\": \"function\", "
                         "\"function\": {\"name\": ...}}", "tool_choice")
    named = [t for t in tools if t.name == name]
    if not named:
        raise BadRequest(f"tool_choice names {name!r}, which is not among the tools "
                         f"({', '.join(t.name for t in tools) or 'none sent'})", "tool_choice")
    return named[0]


def format_schema(response_format: dict | None) -> dict | None:
    """draftwise.grammar.format_schema, its errors a 400 naming `response_format`."""
    try:
        return grammar_format_schema(response_format)
    except ValueError as e:
        raise BadRequest(str(e), "response_format") from None


def _laid_out(schema: dict) -> str:
    """A schema as lark's %json takes it, with the one-line JSON layout (draftwise.grammar)."""
    return json.dumps({**schema, "x-guidance": dict(JSON_LAYOUT)})


def tool_grammar(tools: list[Tool], choice: str | Tool, open_id: int, close_id: int, parallel: bool = True,
                 schema: dict | None = None) -> str:
    """The lark grammar (llguidance's, with %json schemas) of the answers `choice` allows: one
    call, or several when `parallel` (OpenAI's parallel_tool_calls); under "auto" the answer may
    instead be text that does not open with "<", or JSON of `schema` when the request has a
    response_format."""
    called = [choice] if isinstance(choice, Tool) else tools
    one = {"anyOf": [{"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                      "required": ["name", "arguments"], "additionalProperties": False} for t in called]}
    more = ' ("\\n" call)*' if parallel else ""  # a newline may end the last call, as the template writes them
    calls = f'calls: call{more} "\\n"?\ncall: <[{open_id}]> "\\n" %json {_laid_out(one)} "\\n" <[{close_id}]>\n'
    if choice != "auto":
        return "start: calls\n" + calls
    if schema is not None:
        return f"start: calls | answer\nanswer: %json {_laid_out(schema)}\n" + calls
    # small models often write a call's JSON without its tags, bare or in a ```json block: those
    # too, held to the tools' schemas; text may open with neither (nor with a tag)
    bare = f"bare: %json {_laid_out(one)}\n"
    fenced = f'fenced: {json.dumps(FENCE_OPEN)} %json {_laid_out(one)} {json.dumps(FENCE_CLOSE)} "\\n"?\n'
    return "start: calls | bare | fenced | TEXT\n" + calls + bare + fenced + f"TEXT: /{_not_opening(FENCE_OPEN + '{')}/\n"


def _not_opening(prefix: str) -> str:
    """A regex of the texts that open with neither "<", "{" nor `prefix` (its first character "`")."""
    esc = lambda c: "\\n" if c == "\n" else c  # noqa: E731
    alts = ["[^<{`][\\s\\S]*"] + [f"{''.join(map(esc, prefix[:i]))}([^{esc(prefix[i])}][\\s\\S]*)?"
                                   for i in range(1, len(prefix))]
    return "|".join(alts)


@dataclass(frozen=True, slots=True)
class Structured:
    """What a chat request's response_format and tools make of it."""
    grammar: object = None  # the draftwise.grammar.Grammar its answer follows; None: free text
    tools: list[dict] | None = None  # the function specs its chat template renders
    reads_calls: bool = False  # its answer is read for tool calls


async def structured(response_format: dict | None, tools: list[dict] | None, tool_choice, parallel: bool,
                     toks) -> Structured:
    """BadRequest naming the parameter at fault; ValueError from the grammar engine (a schema it
    cannot enforce); MissingExtra without it. `toks`: draftwise.server.load.Tokenizers."""
    parsed = parse_tools(tools)
    choice = parse_choice(tool_choice, parsed)
    schema = format_schema(response_format)
    if choice != "none":
        open_id, close_id = toks.tool_tokens()
        text = tool_grammar(parsed, choice, open_id, close_id, parallel, schema)
        return Structured(await toks.grammar("lark", text), [t.spec for t in parsed], True)
    if schema is not None:
        return Structured(await toks.grammar("json_schema", json.dumps(schema)))
    return Structured()


def call_tokens(tokenizer) -> tuple[int, int]:
    """The ids of the template's <tool_call> and </tool_call> tokens; BadRequest when its chat
    template has no such format."""
    ids = tokenizer.tool_call_tokens()
    if ids is None:
        raise BadRequest("this model's chat template has no tool-call format (<tool_call> tokens): "
                         "tools are not available with it", "tools")
    return ids


def _call(obj: dict) -> dict:
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(obj.get("arguments", {}))}}


def _bare(text: str) -> dict | None:
    """An answer that is one call's JSON without its tags ({"name": ..., "arguments": {...}}),
    alone or in a ```json block."""
    if (m := FENCED.fullmatch(text)) is not None:
        text = m.group(1)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) and isinstance(obj.get("name"), str) and set(obj) <= {"name", "arguments"} \
        else None


def read_calls(text: str) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of a whole answer: each <tool_call> block that holds a JSON object
    with a name becomes a call, as does an answer that is one such object alone; what is left is
    the content (None when nothing is)."""
    if (obj := _bare(text.strip())) is not None:
        return None, [_call(obj)]
    calls, rest, pos = [], [], 0
    for m in re.finditer(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), text, re.S):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            rest.append(text[pos:m.start()])
            pos = m.end()
            calls.append(_call(obj))
    rest.append(text[pos:])
    content = "".join(rest).strip()
    return (content or None) if calls else text, calls


@dataclass(slots=True)
class CallStream:
    """A streamed answer's text, split into content deltas and whole tool calls: content streams
    until the answer opens a <tool_call>; each call is sent as one delta once its block closes
    (OpenAI's clients accumulate a call from any number of deltas). An answer that opens with "{"
    is held whole: at its end it is one call's JSON alone, or content."""
    text: str = ""
    sent: int = 0  # characters of `text` already handled
    calls: int = 0
    in_calls: bool = False
    done: list[dict] = field(default_factory=list)
    held: bool | None = None  # the answer opens as a bare or fenced call would (None: too short to tell)

    def feed(self, piece: str) -> tuple[str, list[dict]]:
        """(content to send now, tool-call deltas to send now)."""
        self.text += piece
        out, deltas = "", []
        if self.held is None:  # decided once: by the first non-blank characters
            lead, opening = len(FENCE_OPEN) + 1, FENCE_OPEN + "{"
            head = self.text.lstrip()[:lead]
            if head.startswith("{") or head == opening:
                self.held = True
            elif not opening.startswith(head):
                self.held = False
        if self.held is not False and not self.calls:
            return out, deltas  # a bare or fenced call, or content that opens alike: at the end
        while True:
            rest = self.text[self.sent:]
            if not self.in_calls:
                at = rest.find(OPEN)
                if at < 0:  # hold back what could be the start of an opening tag (after calls: blanks)
                    keep = next((k for k in range(min(len(OPEN) - 1, len(rest)), 0, -1)
                                 if OPEN.startswith(rest[-k:])), 0)
                    if self.calls and not rest[: len(rest) - keep].strip():
                        return out, deltas
                    out += rest[: len(rest) - keep]
                    self.sent += len(rest) - keep
                    return out, deltas
                out += rest[:at]
                self.sent += at
                self.in_calls = True
                continue
            end = rest.find(CLOSE)
            if end < 0:
                return out, deltas
            block = rest[: end + len(CLOSE)]
            _, got = read_calls(block)
            for c in got:
                deltas.append({"index": self.calls, **c})
                self.calls += 1
            self.sent += len(block)
            self.in_calls = False

    def flush(self) -> tuple[str, list[dict]]:
        """What is left at the end: a held answer that is one call's JSON alone, as a call; else
        text (an unclosed call stays text, as read_calls leaves it)."""
        rest, self.sent = self.text[self.sent:], len(self.text)
        if self.calls == 0 and (obj := _bare(rest.strip())) is not None:
            self.calls = 1
            return "", [{"index": 0, **_call(obj)}]
        return ("" if self.calls and not rest.strip() else rest), []
