"""Constrained decoding on a real small model (SmolLM2-135M on llama.cpp) and the JSON-extraction
workload's schemas: greedy speculation equals constrained plain decoding up to llama.cpp's
numerics (a multi-token verification is not bit-identical to one-token steps: every divergence
must be a near tie between the two best allowed tokens), and every answer that ends is valid
JSON its schema's parser takes to the end."""
import json
from pathlib import Path

import pytest

pytest.importorskip("llguidance")
pytest.importorskip("llama_cpp")

from draftwise.compare import first_divergence  # noqa: E402
from draftwise.drafters.ngram import NgramDrafter  # noqa: E402
from draftwise.engine import Engine  # noqa: E402
from draftwise.grammar import Grammars  # noqa: E402
from draftwise.models.load import load_runner  # noqa: E402

ROWS = Path(__file__).parent.parent / "benchmarks" / "workloads" / "json_extraction_2026_12_07.jsonl"


@pytest.fixture(scope="module")
def smol():
    return load_runner("smollm2-135m", "llama.cpp", threads=2)


NEAR_TIE = 0.5  # logits: a divergence where the two best allowed tokens are closer is numerics


def allowed_gaps(runner, g, ids: list[int], prefix: list[int], tokens: list[int]) -> list[float]:
    """How far below the best allowed token's logit each of `tokens` lies after `prefix` (the
    grammar's mask applied), from one forward over the prompt and the prefix."""
    seq = runner.new_sequence()
    try:
        row = runner.forward([seq], [ids + prefix], [1])[0][-1]  # [V]
    finally:
        runner.free(seq)
    c = g.start()
    c.advance(prefix)
    row = row.float().masked_fill(~c.allowed(), float("-inf"))  # [V]
    return [float(row.max() - row[t]) for t in tokens]


@pytest.mark.slow
def test_constrained_answers_are_valid_and_speculation_is_plain(smol):
    runner, tok = smol
    grammars = Grammars(tok, runner.vocab_size)
    plain_engine, spec_engine = Engine(runner, tok), Engine(runner, tok, NgramDrafter(1, 3), 6)
    rows = [json.loads(x) for x in ROWS.read_text().splitlines()][::2]  # one row per schema
    ended = 0
    for row in rows:
        g = grammars.json_schema(row["response_format"]["json_schema"]["schema"])
        ids = tok.apply_chat(row["messages"])
        plain = plain_engine.generate(ids, max_tokens=160, constraint=g)
        spec = spec_engine.generate(ids, max_tokens=160, constraint=g)
        j = first_divergence(plain.token_ids, spec.token_ids)
        if j is not None:
            gaps = allowed_gaps(runner, g, ids, plain.token_ids[:j], [plain.token_ids[j], spec.token_ids[j]])
            print(f"{row['id']}: divergence at {j}, plain's and speculation's tokens {gaps} below the best allowed")
            assert max(gaps) < NEAR_TIE, (row["id"], j, gaps)
        assert spec.stats.proposed_tokens > 0
        c = g.start()
        c.advance(plain.token_ids)  # raises where a token breaks the grammar: a cut answer is a valid prefix
        if plain.finish_reason == "stop":
            ended += 1
            json.loads(plain.text)
            assert c.finished, plain.text
        else:
            assert plain.finish_reason == "length", plain.finish_reason
    assert ended >= 1  # the 135M model often runs on inside a string past 160 tokens
