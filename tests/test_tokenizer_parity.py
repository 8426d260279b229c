"""llama.cpp's tokenizer gives the same token ids as the transformers tokenizer the engine uses,
on the benchmark prompts as built by draftwise.prompts (chat template included)."""
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from draftwise.models.load import load_tokenizer  # noqa: E402
from draftwise.models.registry import resolve  # noqa: E402
from draftwise.prompts import edit_eval, humaneval, spec_bench  # noqa: E402


@pytest.mark.parametrize("model", [
    "qwen2.5-coder-1.5b",
    pytest.param("smollm2-135m", marks=pytest.mark.xfail(strict=True, reason=(
        "known: llama.cpp and transformers split HumanEval/2 differently for SmolLM2 (index 74); "
        "draftwise always tokenizes with transformers and feeds ids, so its outputs are unaffected"))),
])
def test_benchmark_prompts_tokenize_identically(model):
    src = resolve(model)
    tok = load_tokenizer(src)
    llm = llama_cpp.Llama(src.path, vocab_only=True, verbose=False)
    prompts = edit_eval(10) + humaneval(10) + spec_bench(("writing", "roleplay", "humanities"), 4)
    for p in prompts:
        ids = p.token_ids(tok)
        if p.messages is not None:
            text = tok.hf.apply_chat_template(list(p.messages), add_generation_prompt=True, tokenize=False)
            text += p.assistant_prefix
        else:
            text = p.text
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == ids, p.id
