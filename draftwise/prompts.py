"""Evaluation prompts and their construction: the one place every benchmark builds prompts.

- EditEval: a chat turn with the instruction and the code in a ```python block; the assistant turn
  opens with "```python\\n", so the model starts writing the edited code at once.
- HumanEval: the raw prompt (signature + docstring) as code completion, no chat template.
- Spec-Bench: a chat turn with the row's first turn (both turns on request).
- JSONL files of {"id", "category", "prompt"} (raw) or {"id", "category", "messages"} rows, each
  with an optional `prediction` (a string), `response_format` (OpenAI's json_object / json_schema),
  `tools` and `tool_choice` (OpenAI's; a chat row's, sent to servers: `bench --endpoint-api chat`).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from draftwise.grammar import format_schema
from draftwise.tokenizer import Tokenizer

PROSE = ("writing", "roleplay", "humanities")


@dataclass(frozen=True, slots=True)
class Prompt:
    id: str
    category: str
    text: str | None = None  # raw completion prompt
    messages: tuple[dict, ...] | None = None  # chat turns
    assistant_prefix: str = ""  # opens the assistant turn (chat only)
    prediction: str | None = None  # the expected output (Predicted Outputs), sent by configurations that ask
    response_format: dict | None = None  # OpenAI's: every configuration answers under its JSON schema
    tools: tuple[dict, ...] | None = None  # OpenAI's chat tools (and tool_choice): sent to chat servers
    tool_choice: str | dict | None = None

    def token_ids(self, tokenizer: Tokenizer) -> list[int]:
        if self.messages is not None:
            return tokenizer.apply_chat(list(self.messages), self.assistant_prefix)
        return tokenizer.encode(self.text)


# The evaluation sets shipped in the package (draftwise/data, sources and licences in its
# SOURCES.md): byte-for-byte upstream copies, checked on first read.
DATA_FILES = {
    "edit_eval/edit_eval.jsonl": "521effbaaae30e0ba539a28bc54479a501dfe73ebfaa9c636dff13c8d5df7754",
    "humaneval/HumanEval.jsonl.gz": "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
    "spec_bench/question.jsonl": "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04",
}
_checked: set[Path] = set()


def data_dir() -> Path:
    """The packaged evaluation data, or the directory DRAFTWISE_DATA names (same layout)."""
    env = os.environ.get("DRAFTWISE_DATA")
    d = Path(env) if env else Path(__file__).resolve().parent / "data"
    if not d.is_dir():
        raise FileNotFoundError(f"evaluation data directory {d} not found"
                                + (" (DRAFTWISE_DATA)" if env else ""))
    return d


def data_file(rel: str) -> Path:
    """A data file by its path under data_dir(), its SHA-256 checked against DATA_FILES once."""
    path = data_dir() / rel
    if path not in _checked:
        if not path.is_file():
            raise FileNotFoundError(f"evaluation data file {path} not found")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != DATA_FILES[rel]:
            raise ValueError(f"{path}: SHA-256 {digest} differs from the upstream copy's {DATA_FILES[rel]}")
        _checked.add(path)
    return path


def _jsonl(path: Path) -> list[dict]:
    """The rows of a JSON-lines file (gzipped if .gz); ValueError naming the file and line."""
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a JSON-lines file")
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as f:
        try:
            for n, line in enumerate(f, 1):
                if line.strip():
                    rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} line {n}: not JSON ({e.msg} at column {e.colno})") from None
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text ({e.reason} near byte {e.start} of a line)") from None
    return rows


def edit_eval(n: int | None = None) -> list[Prompt]:
    rows = _jsonl(data_file("edit_eval/edit_eval.jsonl"))
    out = [Prompt(r["task_id"], "editeval",
                  messages=({"role": "user", "content": f"{r['instruction']}\n\n```python\n{r['input']}\n```"},),
                  assistant_prefix="```python\n") for r in rows]
    return out[:n]


def humaneval(n: int | None = None) -> list[Prompt]:
    rows = _jsonl(data_file("humaneval/HumanEval.jsonl.gz"))
    return [Prompt(r["task_id"], "humaneval", text=r["prompt"]) for r in rows][:n]


def spec_bench(categories: tuple[str, ...] | None = None, n: int | None = None,
               both_turns: bool = False) -> list[Prompt]:
    """First n rows of each asked category (in file order); `prose` expands to PROSE."""
    if categories is not None and "prose" in categories:
        categories = tuple(c for c in categories if c != "prose") + PROSE
    out, seen = [], {}
    for r in _jsonl(data_file("spec_bench/question.jsonl")):
        cat = r["category"]
        if categories is not None and cat not in categories:
            continue
        if n is not None and seen.get(cat, 0) >= n:
            continue
        seen[cat] = seen.get(cat, 0) + 1
        turns = r["turns"] if both_turns else r["turns"][:1]
        msgs = tuple({"role": "user", "content": t} for t in turns)  # later turns without answers
        out.append(Prompt(f"spec_bench/{r['question_id']}", cat, messages=msgs[:1] if not both_turns else msgs))
    return out


def from_jsonl(path: str | Path) -> list[Prompt]:
    out = []
    for i, r in enumerate(_jsonl(Path(path))):
        if not isinstance(r, dict):
            raise ValueError(f"{path} row {i}: expected a JSON object, got {type(r).__name__}")
        prediction = r.get("prediction")
        if prediction is not None and not isinstance(prediction, str):
            raise ValueError(f"{path} row {i}: 'prediction' must be a string (the expected output)")
        fmt = r.get("response_format")
        try:
            format_schema(fmt)
        except ValueError as e:
            raise ValueError(f"{path} row {i}: {e}") from None
        tools = r.get("tools")
        if tools is not None and not (isinstance(tools, list) and tools and "messages" in r
                                      and all(isinstance(t, dict) for t in tools)):
            raise ValueError(f"{path} row {i}: 'tools' must be a non-empty list of OpenAI tool objects, "
                             "in a row with 'messages'")
        extra = {"prediction": prediction, "response_format": fmt, "tools": tuple(tools) if tools else None,
                 "tool_choice": r.get("tool_choice")}
        if "messages" in r:
            m = r["messages"]
            if not (isinstance(m, list) and m and all(isinstance(x, dict) and isinstance(x.get("role"), str)
                                                       and isinstance(x.get("content"), str) for x in m)):
                raise ValueError(f"{path} row {i}: 'messages' must be a non-empty list of "
                                 "{\"role\": ..., \"content\": ...} objects with string values")
            out.append(Prompt(str(r.get("id", i)), r.get("category", "custom"), messages=tuple(r["messages"]),
                              **extra))
        elif "prompt" in r:
            out.append(Prompt(str(r.get("id", i)), r.get("category", "custom"), text=r["prompt"], **extra))
        else:
            raise ValueError(f"{path} row {i}: needs a 'prompt' or 'messages' field")
    return out


def sample(prompts: list[Prompt], n_per_category: int, seed: int = 0) -> list[Prompt]:
    """n prompts per category, drawn with a seed; order kept."""
    by_cat: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        by_cat.setdefault(p.category, []).append(i)
    rng = random.Random(seed)
    keep = sorted(i for idx in by_cat.values() for i in rng.sample(idx, min(n_per_category, len(idx))))
    return [prompts[i] for i in keep]


def load_workload(name: str, n: int | None = None) -> list[Prompt]:
    """editeval | humaneval | prose | a Spec-Bench category | a .jsonl path | a comma list of those."""
    out: list[Prompt] = []
    for part in name.split(","):
        if part.endswith(".jsonl") or part.endswith(".jsonl.gz"):
            out += from_jsonl(part)[:n] if n else from_jsonl(part)
        elif part == "editeval":
            out += edit_eval(n)
        elif part == "humaneval":
            out += humaneval(n)
        else:
            rows = spec_bench((part,), n)
            if not rows:
                raise ValueError(f"unknown workload {part!r}: not editeval, humaneval, prose, "
                                 "a Spec-Bench category or a .jsonl file")
            out += rows
    return out
