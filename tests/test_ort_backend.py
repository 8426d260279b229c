"""The onnx backend (ONNX Runtime GenAI): conversion's pass-through and errors, and on the converted
smollm2-135m: all-position logits, exact rewind, chunked prefill, sequences apart, greedy identity.

The real-model tests skip where onnxruntime-genai or the converted model is absent; convert it once with
    .venv/bin/python -c "from draftwise.models.ort_convert import ort_model_dir; ort_model_dir('smollm2-135m')"
"""
from __future__ import annotations

import json
import sys

import pytest
import torch

from draftwise.models import ort_convert

MODEL = "smollm2-135m"
PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and a loop."


def test_a_runtime_model_directory_is_taken_as_it_is(tmp_path):
    (tmp_path / ort_convert.CONFIG).write_text("{}")
    assert ort_convert.ort_model_dir(str(tmp_path)) == tmp_path
    assert ort_convert.converted_dir(str(tmp_path)) == tmp_path
    assert ort_convert.converted_dir(str(tmp_path / "nothing")) is None


def test_a_converter_without_the_builder_names_what_to_install(monkeypatch):
    monkeypatch.setattr(ort_convert, "BUILDER_MODULES", ("json", "no_such_module_draftwise"))
    with pytest.raises(ort_convert.ConverterMissing) as e:
        ort_convert.check_converter(sys.executable)
    msg = str(e.value)
    assert "missing: no_such_module_draftwise" in msg and "pip install onnxruntime-genai==0.18.0" in msg
    assert ort_convert.PYTHON_ENV in msg
    with pytest.raises(ort_convert.ConverterMissing, match=ort_convert.PYTHON_ENV):
        ort_convert.check_converter("/nonexistent/python")


def test_the_backend_is_selectable():
    import argparse

    from draftwise.cli_args import _model_args, _spec
    from draftwise.models.load import BACKENDS

    p = argparse.ArgumentParser()
    _model_args(p)
    a = p.parse_args(["--backend", "onnx", "--drafter", "ngram"])
    spec = _spec(a)
    assert "onnx" in BACKENDS and spec.backend == spec.draft_backend == "onnx"


# --- on the converted model -------------------------------------------------------------------

og = pytest.importorskip("onnxruntime_genai")


@pytest.fixture(scope="module")
def loaded():
    from draftwise.models.load import load_onnx

    if ort_convert.converted_dir(MODEL) is None:
        pytest.skip(f"{MODEL} is not converted for the onnx backend (module docstring)")
    runner, tok = load_onnx(MODEL, threads=1, max_context=512)
    yield runner, tok
    runner.close()


@pytest.fixture
def seqs(loaded):
    runner, made = loaded[0], []

    def make():
        made.append(runner.new_sequence())
        return made[-1]

    yield make
    for s in made:
        runner.free(s)


def _ids(tok):
    return tok.apply_chat([{"role": "user", "content": PROMPT}])


def test_declares_what_it_offers(loaded):
    runner, tok = loaded
    assert runner.backend == "onnx" and not runner.trees and not runner.saves and not runner.returns_features
    cfg = json.loads((runner.model_dir / ort_convert.CONFIG).read_text())["model"]
    assert runner.vocab_size == cfg["vocab_size"] >= len(tok.hf.get_vocab())
    assert runner.forward_parts([3, 1]) == [(3, 1), (1, 1)]


def _split(runner, seq, ids, sizes):  # the rows of ids fed in forwards of these sizes: [len(ids), V]
    out, i = [], 0
    for k in sizes:
        out.append(runner.forward([seq], [ids[i: i + k]], [k])[0])
        i += k
    return torch.cat(out)


def test_logits_at_every_position_are_the_same_however_the_tokens_are_split(loaded, seqs):
    runner, tok = loaded
    ids = _ids(tok)
    a, b, c = seqs(), seqs(), seqs()
    runner.forward([a, b, c], [ids[:-8]] * 3, [0] * 3)
    batch = runner.forward([a], [ids[-8:]], [8])[0]  # [8, V]
    assert batch.shape == (8, runner.vocab_size) and batch.dtype == torch.float32
    assert torch.equal(_split(runner, b, ids[-8:], [1] * 8), batch)  # padded one-token forwards: bitwise
    assert torch.equal(_split(runner, c, ids[-8:], [3, 1, 2, 2]), batch)
    assert runner.length(a) == runner.length(b) == runner.length(c) == len(ids)


def test_without_padding_a_one_token_forward_takes_another_kernel(loaded, seqs):
    runner, tok = loaded
    ids = _ids(tok)
    a, b = seqs(), seqs()
    runner.forward([a, b], [ids[:-4]] * 2, [0] * 2)
    batch = runner.forward([a], [ids[-4:]], [4])[0]
    runner.pad = False
    try:
        single = _split(runner, b, ids[-4:], [1] * 4)
    finally:
        runner.pad = True
    assert (single.argmax(-1) == batch.argmax(-1)).all()
    assert not torch.equal(single, batch)  # the reason for `pad` (backends/ort_runner.py)


def test_truncate_is_exact(loaded, seqs):
    runner, tok = loaded
    ids = _ids(tok)
    s = seqs()
    first = runner.forward([s], [ids], [4])[0]
    runner.truncate(s, len(ids) - 4)
    assert runner.length(s) == len(ids) - 4
    runner.forward([s], [[5, 6, 7]], [3])  # a rejected draft, dropped again
    runner.truncate(s, len(ids) - 4)
    again = runner.forward([s], [ids[-4:]], [4])[0]
    assert torch.equal(first, again)
    with pytest.raises(ValueError, match="cannot truncate"):
        runner.truncate(s, len(ids) + 1)


def test_a_prompt_fed_in_chunks_gives_its_rows(loaded, seqs):
    runner, tok = loaded
    ids = _ids(tok)
    whole = runner.forward([seqs()], [ids], [len(ids)])[0]
    chunk = runner.chunk
    runner.chunk = 7
    try:
        parts = runner.forward([seqs()], [ids], [9])[0]  # the last 9 rows cross a chunk boundary
    finally:
        runner.chunk = chunk
    assert parts.shape == (9, runner.vocab_size)
    assert torch.equal(parts, whole[-9:])


def test_sequences_are_apart_and_reused(loaded, seqs):
    runner, tok = loaded
    ids = _ids(tok)
    a, b = seqs(), seqs()
    together = runner.forward([a, b], [ids, ids[:10]], [1, 1])
    alone = runner.forward([seqs()], [ids[:10]], [1])[0]
    assert torch.equal(together[1], alone)
    runner.free(a)
    c = runner.new_sequence()  # a freed sequence's generator, rewound to 0
    try:
        assert runner.length(c) == 0
        assert torch.equal(runner.forward([c], [ids], [1])[0], together[0])
    finally:
        runner.free(c)
    with pytest.raises(ValueError, match="exceed the context"):
        runner.forward([b], [[1] * runner.max_context], [1])
    with pytest.raises(ValueError, match="chains only"):
        runner.forward([b], [[1, 2]], [2], parents=[[-1, -1]])


def test_speculative_greedy_equals_plain_greedy(loaded):
    from draftwise.drafters.ngram import NgramDrafter
    from draftwise.engine import Engine

    runner, tok = loaded
    prompt = _ids(tok)
    plain = Engine(runner, tok).generate(prompt, max_tokens=48)
    for d in (3, 8):
        spec = Engine(runner, tok, NgramDrafter(1, 3), d).generate(prompt, max_tokens=48)
        assert spec.token_ids == plain.token_ids, d
        assert spec.stats.proposed_tokens > 0
