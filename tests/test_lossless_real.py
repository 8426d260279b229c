"""`draftwise verify` on real models (llama.cpp): the real acceptance rule passes, a known bug
(resampling from p instead of the residual after a rejection) is flagged, and each check had at
least the rejections its power calculation needs (otherwise it would have tested nothing)."""
import os

import pytest

pytest.importorskip("llama_cpp")
# Minutes of sampling per check on this CPU (the Qwen pair: ~5 min per setting), and the settings
# below have not yet been shown to give every check enough rejections and power: opt-in for now.
pytestmark = pytest.mark.skipif(os.environ.get("DRAFTWISE_LOSSLESS_REAL") != "1",
                                reason="set DRAFTWISE_LOSSLESS_REAL=1 (slow; see docs/verify.md)")

from draftwise.drafters.model import ModelDrafter  # noqa: E402
from draftwise.drafters.ngram import NgramDrafter  # noqa: E402
from draftwise.engine import Engine  # noqa: E402
from draftwise.losscheck import check_sampling, resample_from_p  # noqa: E402
from draftwise.models.load import load_runner  # noqa: E402
from draftwise.verify import rejection_sample  # noqa: E402

SETTINGS = [(0.7, 0.9), (1.0, 1.0)]  # (temperature, top_p)
CHECK = dict(positions=2, min_tv=0.2)


def _run(runner, tok, drafter, ids, temperature, top_p):
    plain = Engine(runner, tok, reuse_prefix=True)
    shared: dict = {}  # one plain sample serves both checks
    reports = {}
    for sampler in (rejection_sample, resample_from_p):
        spec = Engine(runner, tok, drafter, 4, sampler=sampler, reuse_prefix=True)
        reports[sampler] = check_sampling(plain, spec, [ids], temperature, top_p, plain_samples=shared, **CHECK)
    good, bad = reports[rejection_sample], reports[resample_from_p]
    for rep in (good, bad):
        assert rep.samples >= rep.required_samples
        assert any(r.tested for r in rep.results), "too few rejections: " + rep.summary()
    assert good.verdict == "PASS", good.summary()
    assert bad.verdict == "FAIL", bad.summary()


@pytest.fixture(scope="module")
def smol():
    return load_runner("smollm2-135m", "llama.cpp", threads=2)


@pytest.mark.parametrize("temperature,top_p", SETTINGS)
def test_ngram_drafter(smol, temperature, top_p):
    runner, tok = smol
    ids = tok.apply_chat([{"role": "user", "content": "List twenty colours, one per line, each as '- colour: <name>'."}])
    _run(runner, tok, NgramDrafter(1, 3), ids, temperature, top_p)


@pytest.fixture(scope="module")
def qwen_pair():
    target, tok = load_runner("qwen2.5-coder-1.5b", "llama.cpp", threads=2)
    draft, _ = load_runner("qwen2.5-coder-0.5b", "llama.cpp", threads=2)
    return target, tok, ModelDrafter(draft)


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_p", SETTINGS)
def test_qwen_draft_model(qwen_pair, temperature, top_p):
    target, tok, drafter = qwen_pair
    ids = tok.apply_chat([{"role": "user", "content": "Write a short poem about the sea."}])
    _run(target, tok, drafter, ids, temperature, top_p)
