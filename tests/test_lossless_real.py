"""`draftwise verify` on real models (llama.cpp): the real acceptance rule passes, the known bug
(resampling from p instead of the residual after a rejection) is flagged, at temperature 0.7 /
top-p 0.9 and at 1.0.

Each check tests output position 1 only, on a prompt chosen so that the bug's bias there is large,
and that bias is computed beforehand from the models (draftwise.bugbias). The test fails if that
predicted bias is below what the check is sized for (min_tv), if fewer samples were drawn than the
power calculation asks, or if fewer rejections occurred at position 1 than the check needs.

SmolLM2 + n-gram runs in CI (~55 s; passed here at both settings: real rule p = 0.62 / 0.86, bug
p = 1e-8 / 3e-9, 145 / 159 rejections at position 1 where 61 are needed), and SmolLM2 + the
suffix drafter's candidate trees at T 0.7 (~75 s: the wrong rule on tree rounds only). The Qwen
pair is opt-in (DRAFTWISE_LOSSLESS_REAL=1) and needs a prompt with a predicted bias >= min_tv
(QWEN_PROMPT)."""
import os

import pytest

pytest.importorskip("llama_cpp")
QWEN_OPT_IN = pytest.mark.skipif(os.environ.get("DRAFTWISE_LOSSLESS_REAL") != "1",
                                 reason="set DRAFTWISE_LOSSLESS_REAL=1 (the Qwen pair takes minutes)")

from draftwise.drafters.model import ModelDrafter  # noqa: E402
from draftwise.drafters.ngram import NgramDrafter  # noqa: E402
from draftwise.drafters.suffix import SuffixDrafter  # noqa: E402
from draftwise.engine import Engine  # noqa: E402
from draftwise.losscheck import check_sampling, resample_from_p, resample_from_p_tree  # noqa: E402
from draftwise.models.load import load_runner  # noqa: E402

SETTINGS = [(0.7, 0.9), (1.0, 1.0)]  # (temperature, top_p)
# Sized for TV 0.2 below the predicted ~0.25, at alpha 0.01 and power 0.99 (301 samples per side):
# a margin for the chi-square test's lower power over more than two categories (docs/verify.md).
CHECK = dict(positions=1, min_tv=0.2, alpha=0.01, power=0.99)

# A record of answers: position 0 is ":" (almost surely), position 1 is " right" or " left". The
# n-gram drafter proposes " right" (what followed the last "Answer:"), which SmolLM2 gives p ~ 0.5
# at both settings: the bug adds p (1 - p) ~ 0.25 to it.
NGRAM_PROMPT = "".join(f"Answer: {a}\n" for a in ("right", "right", "right", "left", "right", "right")) + "Answer"


def _run(runner, tok, drafter, ids, temperature, top_p, num_draft_tokens=4, bug=None, **check):
    """`bug`: the Engine keywords that inject the wrong rule (default: on chains)."""
    check = {**CHECK, **check}
    plain = Engine(runner, tok, reuse_prefix=True, max_running=1)
    shared: dict = {}  # one plain sample serves both checks
    reports = []
    for kw in ({}, bug or {"sampler": resample_from_p}):
        spec = Engine(runner, tok, drafter, num_draft_tokens, reuse_prefix=True, max_running=1, **kw)
        reports.append(check_sampling(plain, spec, [ids], temperature, top_p, plain_samples=shared,
                                      predict_bias=not kw, **check))
    good, bad = reports
    print(f"\nT={temperature} top_p={top_p}\n--- real rule\n{good.summary()}\n--- injected bug\n{bad.summary()}")
    bias = good.bug_bias[0]
    assert bias.tv - bias.untracked >= check["min_tv"], "the bug is too small here for this check to see"
    for rep in (good, bad):
        assert rep.samples >= rep.required_samples
        assert all(r.tested for r in rep.results), "fewer rejections than the check needs: " + rep.summary()
    assert good.verdict == "PASS", good.summary()
    assert bad.verdict == "FAIL", bad.summary()
    return good, bad


@pytest.fixture(scope="module")
def smol():
    return load_runner("smollm2-135m", "llama.cpp", threads=2)


@pytest.mark.parametrize("temperature,top_p", SETTINGS)
def test_ngram_drafter(smol, temperature, top_p):
    runner, tok = smol
    _run(runner, tok, NgramDrafter(1, 3), tok.encode(NGRAM_PROMPT), temperature, top_p)


# One question asked three times with three answers: after ":" the suffix drafter proposes the
# three answers as siblings (a candidate tree at position 1). SmolLM2 gives them p(S) ~ 0.2 at
# T 0.7 / top-p 0.9, so the wrong rule on tree rounds adds p(S) (1 - p(S)) ~ 0.17: sized for 0.15.
QUESTION = "Q: Pick one animal at random from the farm.\nA"
TREE_PROMPT = "".join(f"{QUESTION}: {a}\n" for a in ("cat", "cow", "dog")) + QUESTION


@pytest.fixture(scope="module")
def smol_trees():
    return load_runner("smollm2-135m", "llama.cpp", threads=2, trees=True)


def test_suffix_tree_drafter(smol_trees):
    runner, tok = smol_trees
    good, bad = _run(runner, tok, SuffixDrafter(tree=True), tok.encode(TREE_PROMPT), 0.7, 0.9, num_draft_tokens=8,
                     bug={"tree_sampler": resample_from_p_tree}, min_tv=0.15)
    assert good.tree_rounds > good.samples / 2  # position 1 is (almost) always a tree


# A raw prompt on which Qwen2.5-Coder-0.5B and -1.5B disagree at output position 1: the best of
# 21 answer-record prompts by predicted bias (0.213 at T 0.7 / top-p 0.9, 0.175 at T 1.0), so
# the check is sized for TV 0.2 and 0.15 there (a model drafter's bias is at most min(b, 1 - b)).
QWEN_PROMPT: str | None = "".join(f"Answer: {a}\n" for a in ("dog", "cat", "dog", "dog", "cat")) + "Answer"
QWEN_MIN_TV = {0.7: 0.2, 1.0: 0.15}


@pytest.fixture(scope="module")
def qwen_pair():
    target, tok = load_runner("qwen2.5-coder-1.5b", "llama.cpp", threads=2)
    draft, _ = load_runner("qwen2.5-coder-0.5b", "llama.cpp", threads=2)
    return target, tok, ModelDrafter(draft)


@pytest.mark.slow
@QWEN_OPT_IN
@pytest.mark.skipif(QWEN_PROMPT is None, reason="no prompt yet with a large enough predicted bias")
@pytest.mark.parametrize("temperature,top_p", SETTINGS)
def test_qwen_draft_model(qwen_pair, temperature, top_p):
    target, tok, drafter = qwen_pair
    _run(target, tok, drafter, tok.encode(QWEN_PROMPT), temperature, top_p, num_draft_tokens=1,
         min_tv=QWEN_MIN_TV[temperature])
