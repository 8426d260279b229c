"""Constrained decoding on a real small model (SmolLM2-135M on llama.cpp) and the JSON-extraction
workload's schemas: greedy speculation equals constrained plain decoding, and every answer that
ends is valid JSON its schema's parser takes to the end."""
import json
from pathlib import Path

import pytest

pytest.importorskip("llguidance")
pytest.importorskip("llama_cpp")

from draftwise.compare import divergence_report  # noqa: E402
from draftwise.drafters.ngram import NgramDrafter  # noqa: E402
from draftwise.engine import Engine  # noqa: E402
from draftwise.grammar import Grammars  # noqa: E402
from draftwise.models.load import load_runner  # noqa: E402

ROWS = Path(__file__).parent.parent / "benchmarks" / "workloads" / "json_extraction_2026_12_07.jsonl"


@pytest.fixture(scope="module")
def smol():
    return load_runner("smollm2-135m", "llama.cpp", threads=2)


@pytest.mark.slow
def test_constrained_answers_are_valid_and_speculation_is_plain(smol):
    runner, tok = smol
    grammars = Grammars(tok, runner.vocab_size)
    plain_engine, spec_engine = Engine(runner, tok), Engine(runner, tok, NgramDrafter(1, 3), 6)
    rows = [json.loads(x) for x in ROWS.read_text().splitlines()][::2]  # one row per schema
    ended = 0
    for row in rows:
        g = grammars.json_schema(row["response_format"]["json_schema"]["schema"])
        ids = tok.apply_chat([{"role": "user", "content": row["prompt"]}])
        plain = plain_engine.generate(ids, max_tokens=160, constraint=g)
        spec = spec_engine.generate(ids, max_tokens=160, constraint=g)
        assert divergence_report(runner, ids, plain.token_ids, spec.token_ids) is None, row["id"]
        assert spec.stats.proposed_tokens > 0
        if plain.finish_reason == "stop":
            ended += 1
            json.loads(plain.text)
            c = g.start()
            c.advance(plain.token_ids)
            assert c.finished, plain.text
    assert ended >= len(rows) - 1
