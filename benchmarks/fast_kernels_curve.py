"""The 1.5B's llama.cpp forward-cost curve (logits at every position, as verification needs them)
in draftwise's default exact mode and with `--fast-kernels` (llama.cpp's repacked weights), side
by side in one process.

    .venv/bin/python benchmarks/fast_kernels_curve.py
"""
from draftwise.backends.llama_runner import load_llama
from draftwise.profile import profile_runner

if __name__ == "__main__":
    for fast in (False, True):
        runner, _ = load_llama("qwen2.5-coder-1.5b", threads=2, fast_kernels=fast)
        prof = profile_runner(runner, ks=[1, 2, 3, 4, 8, 12, 16], batch_sizes=(1,))
        print("fast_kernels" if fast else "exact       ", [(r["k"], round(r["ms_median"], 1)) for r in prof.rows])
        del runner
