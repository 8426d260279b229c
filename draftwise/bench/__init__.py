"""`draftwise bench`: measure plain decoding and speculative configurations (or servers) under
fixed conditions, interleaved, resumable; summarise with bootstrap intervals; report as HTML.

    path = run_bench(BenchConfig(workload="editeval", configs=("plain", "ngram:4,8")))
    summary = summarise(path); summary.save(path.parent); write_report(summary, path.parent / "report.html")
"""
from draftwise.bench.config import BenchConfig, RunConfig, load_prompts
from draftwise.bench.report import write_report
from draftwise.bench.run import run_bench
from draftwise.bench.summary import Summary, summarise

__all__ = ["BenchConfig", "RunConfig", "Summary", "load_prompts", "run_bench", "summarise", "write_report"]
