"""train-head's text: the instructions the target answers (fixed order, none from an evaluation
set) and its batched answers, kept in a file so a rerun generates only the missing ones."""
import json

import pytest

from draftwise import prompts
from draftwise.head_text import INSTRUCTIONS, TASKS, TOPICS, answers, instructions, local_texts
from tests.fakes import CharTokenizer, CycleRunner

FUNC = "def f(a, b):\n" + "".join(f"    x{i} = a + {i}\n" for i in range(6)) + "    return x0 + b\n"
PROSE = ("Gardens need patient care over many seasons and their keepers learn to read the weather and the "
         "soil with attention and humility. ") * 6
TEXTS = [("stdlib/m.py", FUNC), ("docs/p/README.md", PROSE)]


def test_instructions_are_fixed_distinct_and_mixed():
    assert instructions(5, TEXTS) == list(INSTRUCTIONS[:5])
    ins = instructions(60, TEXTS)
    assert ins == instructions(60, TEXTS) and len(set(ins)) == 60
    assert ins[:len(INSTRUCTIONS)] == list(INSTRUCTIONS)
    composed = ins[len(INSTRUCTIONS):]
    assert sum(PROSE.strip() in i for i in composed) == 1  # the one passage, asked about once
    assert sum(FUNC.strip() in i for i in composed) == 1  # the one function, to edit once
    assert sum(any(i == t.format(t=topic) for t in TASKS for topic in TOPICS) for i in composed) == 58 - 32
    with pytest.raises(ValueError, match="only .* instructions can be composed, asked for"):
        instructions(len(INSTRUCTIONS) + len(TASKS) * len(TOPICS) + 3, TEXTS)


def test_no_instruction_or_passage_comes_from_an_evaluation_set():
    ins = "\n".join(instructions(400, local_texts()))
    evals = prompts.edit_eval() + prompts.humaneval() + prompts.spec_bench()
    for p in evals:
        text = p.text if p.text is not None else p.messages[0]["content"]
        snippet = " ".join(text.split())[:80]
        assert len(snippet) < 40 or snippet not in " ".join(ins.split()), p.id


class ChatTokenizer(CharTokenizer):
    def apply_chat(self, messages, assistant_prefix=""):
        return [len(messages[0]["content"]) % 5]


def test_answers_are_kept_and_a_rerun_generates_only_the_missing(tmp_path):
    runner, tok, path, said = CycleRunner(period=15), ChatTokenizer(), tmp_path / "answers.jsonl", []
    got = answers(runner, tok, 3, 6, path, said.append, batch=2)
    assert [src for src, _ in got] == ["answer/0", "answer/1", "answer/2"]
    for (_, ids), text in zip(got, INSTRUCTIONS):
        first = len(text) % 5  # the prompt, then the target's greedy answer: (t + 1) % 15 after t
        assert ids == [first] + [(first + j) % 15 for j in range(1, 7)]
    assert len(path.read_text().splitlines()) == 3 and len(said) == 3
    forwards = len(runner.forwards)
    again = answers(runner, tok, 3, 6, path, said.append, batch=2)
    assert again == got and len(runner.forwards) == forwards  # nothing generated again
    more = answers(runner, tok, 4, 6, path, said.append, batch=2)
    assert more[:3] == got and len(more) == 4 and len(path.read_text().splitlines()) == 4
    assert [json.loads(line)["i"] for line in path.read_text().splitlines()] == [0, 1, 2, 3]
