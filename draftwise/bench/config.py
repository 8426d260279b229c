"""What a benchmark run measures: the fixed conditions, the configurations and the workload.

Every configuration of a run shares the target model, tokenizer, sampling settings and output
limit; the drafter and draft length D change, and a configuration may name its backend
(`plain@onnx`: the target loaded once per backend named); for servers, the endpoint.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from draftwise.bench.goal import parse_goal
from draftwise.build import EngineSpec, ModelFields, resolve_kernels
from draftwise.prompts import Prompt, load_workload, sample, spec_bench
from draftwise.sampling import SamplingParams

MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SPEC_BENCH = MT_BENCH + ("translation", "summarization", "qa", "math_reasoning", "rag")
_DRAFTERS = ("ngram", "model", "suffix", "suffix-tree", "head", "auto")
_PLAN = ("configs", "workload", "n_per_category", "seed", "repeats", "warmup", "concurrency", "margins",
         "out_dir", "metrics")
_JUDGING = ("goal",)  # how results are judged, not how they are measured: free to change between runs


PREDICTION = "+prediction"  # a configuration (or a server's label) ending so sends the prompts' predictions
BACKENDS = ("torch", "llama.cpp", "onnx")  # a configuration's own backend: 'ngram:auto@onnx'


@dataclass(frozen=True, slots=True)
class RunConfig:
    """One configuration: `plain`, `DRAFTER:D` in process, or a server's label."""
    name: str
    drafter: str  # "none" | "ngram" | "model" | "suffix" | "suffix-tree" | "head" | "auto" | "endpoint"
    num_draft_tokens: int | str = 0  # D, or "auto" (the planner's choice); 0 for plain decoding and servers
    prediction: bool = False  # send each prompt's prediction (a workload row's `prediction`)
    backend: str | None = None  # its target's backend (None: the run's --backend)

    @staticmethod
    def parse(text: str) -> list[RunConfig]:
        """'plain' | 'ngram:4' | 'model:2,4,8' (a sweep over D: one configuration per D) | 'ngram:auto';
        a trailing '+prediction' sends each prompt's prediction ('ngram:auto+prediction'), a
        trailing '@BACKEND' runs it on that backend ('plain@onnx', 'ngram:auto+prediction@onnx')."""
        text, at, backend = text.partition("@")
        if at and backend not in BACKENDS:
            raise ValueError(f"configuration {text}@{backend}: the backend after @ must be one of {', '.join(BACKENDS)}")
        suffix = f"@{backend}" if at else ""
        return [RunConfig(c.name + suffix, c.drafter, c.num_draft_tokens, c.prediction, backend or None)
                for c in RunConfig._parse(text)]

    @staticmethod
    def _parse(text: str) -> list[RunConfig]:
        if text == "plain":
            return [RunConfig("plain", "none")]
        text, plus, _ = text.partition(PREDICTION)
        kind, _, ds = text.partition(":")
        if kind not in _DRAFTERS or not ds:
            raise ValueError(f"unknown configuration {text!r}: use plain, or DRAFTER:D with DRAFTER one of "
                             f"{', '.join(_DRAFTERS)} and D an integer, auto or a sweep such as ngram:2,4,8,auto")
        try:
            values = [d if d == "auto" else int(d) for d in ds.split(",")]
        except ValueError:
            raise ValueError(f"configuration {text!r}: D must be integers or auto") from None
        if any(d != "auto" and d < 1 for d in values):
            raise ValueError(f"configuration {text!r}: D must be >= 1")
        return [RunConfig(f"{kind}:{d}{plus}", kind, d, bool(plus)) for d in values]


def parse_configs(items: list[str] | tuple[str, ...]) -> list[RunConfig]:
    out = [c for item in items for c in RunConfig.parse(item)]
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise ValueError(f"configurations repeat: {names}")
    return out


@dataclass(slots=True, kw_only=True)
class BenchConfig(ModelFields):
    # fixed conditions: the models (ModelFields, as every command), and
    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    sample_seed: int | None = 0  # per request: sample_seed + 1000 * repeat + prompt index
    # what is compared
    configs: tuple[str, ...] = ("plain", "ngram:4", "model:4")
    baseline: str = "plain"
    # workload
    workload: str = "editeval"
    n_per_category: int | None = 5  # None: every prompt
    seed: int = 0  # for drawing prompts
    both_turns: bool = False
    context_edges: tuple[int, ...] = (512,)  # prompt-token bucket edges: short < 512 <= long
    # protocol
    repeats: int = 1
    warmup: int = 1  # unmeasured requests per configuration before the first measured one
    concurrency: tuple[int, ...] = (1,)
    prompt_cache_mb: int = 0  # each in-process configuration's prompt cache (0: off; EngineSpec)
    margins: bool = True  # at temperature 0, the target's top-2 margin at each divergence
    out_dir: str = "results/bench"
    # servers: label -> base URL; then configs are those labels and baseline the first unless named
    endpoints: dict[str, str] = field(default_factory=dict)
    endpoint_model: str | None = None  # the request's "model" field; None: the server's first
    endpoint_api: str = "tokens"  # tokens: /v1/completions with token ids | chat: messages
    metrics: bool = True  # read Prometheus spec-decode counters around each request group
    # judging
    goal: str | None = None  # service goal, e.g. "itl_p95<=0.25,speedup>=1.05" (draftwise/bench/goal.py)

    def __post_init__(self) -> None:
        SamplingParams(self.temperature, self.top_p, self.top_k, self.sample_seed)
        positive = {"max_tokens": self.max_tokens, "repeats": self.repeats}
        for k, v in positive.items():
            if v < 1:
                raise ValueError(f"{k} must be >= 1, got {v}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if self.prompt_cache_mb < 0:
            raise ValueError(f"prompt_cache_mb must be >= 0, got {self.prompt_cache_mb}")
        self.check_models()
        if self.n_per_category is not None and self.n_per_category < 1:
            raise ValueError(f"n_per_category must be >= 1, got {self.n_per_category}")
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ValueError(f"concurrency levels must be >= 1, got {self.concurrency}")
        if list(self.context_edges) != sorted(set(self.context_edges)) or any(e < 1 for e in self.context_edges):
            raise ValueError(f"context_edges must be increasing positive token counts, got {self.context_edges}")
        if self.endpoint_api not in ("tokens", "chat"):
            raise ValueError(f"endpoint_api must be 'tokens' or 'chat', got {self.endpoint_api!r}")
        if self.goal is not None:
            parse_goal(self.goal)  # before any measuring
        self.configs, self.concurrency = tuple(self.configs), tuple(self.concurrency)
        self.context_edges = tuple(self.context_edges)
        if self.endpoints:
            self.configs = tuple(self.endpoints)
            if self.baseline not in self.endpoints:
                self.baseline = self.configs[0]
        names = [c.name for c in self.run_configs()]
        if self.baseline not in names:
            raise ValueError(f"baseline {self.baseline!r} is not among the configurations {names}")

    def engine_spec(self, drafter: str = "none", num_draft_tokens: int | str = 0,
                    backend: str | None = None) -> EngineSpec:
        """The spec an in-process configuration loads with (on `backend`: a configuration's own);
        it holds every concurrency level's requests."""
        drafting = any(c.drafter != "none" for c in self.run_configs())  # one target serves every configuration
        fields = self.model_fields() | ({"backend": backend, "draft_backend": None} if backend else {})
        return EngineSpec(**{**fields, "kernels": resolve_kernels(self.kernels, drafting)},
                          drafter=drafter, num_draft_tokens=num_draft_tokens, max_running=max(self.concurrency),
                          prompt_cache_mb=self.prompt_cache_mb,
                          trees=any(c.drafter == "suffix-tree" for c in self.run_configs()))

    def run_configs(self) -> list[RunConfig]:
        if self.endpoints:
            return [RunConfig(name, "endpoint", prediction=name.endswith(PREDICTION)) for name in self.endpoints]
        return parse_configs(self.configs)

    def conditions(self) -> dict:
        """What every configuration shares, stored with the results; a resumed run must match."""
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items() if k not in _PLAN + _JUDGING}

    def plan(self) -> dict:
        """What is run: may grow between sessions of one results directory (more repeats, more
        configurations), since requests are keyed by repeat, prompt, configuration and concurrency."""
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items() if k in _PLAN}

    def bucket(self, prompt_tokens: int) -> str:
        return context_bucket(prompt_tokens, self.context_edges)


def context_bucket(n: int, edges: tuple[int, ...]) -> str:
    """'<512', '512-2047', '>=2048' for edges (512, 2048)."""
    lo = 0
    for e in edges:
        if n < e:
            return f"<{e}" if lo == 0 else f"{lo}-{e - 1}"
        lo = e
    return f">={lo}" if edges else "all"


def load_prompts(cfg: BenchConfig) -> list[Prompt]:
    """The workload, then n prompts per category drawn with the seed.

    Parts (comma-separated): editeval | humaneval | specbench (all 13 categories) | mtbench (its
    first 8) | prose (writing, roleplay, humanities) | a Spec-Bench category | a .jsonl file.
    """
    out: list[Prompt] = []
    for part in cfg.workload.split(","):
        groups = {"specbench": SPEC_BENCH, "mtbench": MT_BENCH}
        if part in groups or part == "prose" or part in SPEC_BENCH:
            cats = groups.get(part, (part,))
            out += spec_bench(cats, both_turns=cfg.both_turns)
        else:
            out += load_workload(part)
    if not out:
        raise ValueError(f"workload {cfg.workload!r} holds no prompts")
    ids = [p.id for p in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"workload {cfg.workload!r} repeats prompt ids; results are keyed by id")
    return sample(out, cfg.n_per_category, cfg.seed) if cfg.n_per_category else out


def run_prompts(plan: dict, conditions: dict) -> dict[str, Prompt]:
    """The prompts a stored bench run asked, by id, rebuilt from its session's plan (workload, n,
    seed) and its conditions (both_turns): draftwise.bench.results.Results' sessions[0]["plan"]
    and meta["conditions"]."""
    cfg = BenchConfig(workload=plan["workload"], n_per_category=plan["n_per_category"], seed=plan["seed"],
                      both_turns=bool(conditions.get("both_turns")))
    return {p.id: p for p in load_prompts(cfg)}
