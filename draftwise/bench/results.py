"""The results file: JSON lines, appended one record at a time, so an interrupted run keeps what it
measured and a rerun resumes where it stopped.

Record kinds:
- meta: the run's fixed conditions (first line); a resumed run must have the same
- session: one per start: environment (versions, machine, threads), what each configuration runs
  on, prompts left out; a resumed run may differ here, and the report lists every session
- request: one measured request, keyed by [repeat, prompt_id, config, concurrency]
- server: a server's spec-decode counter delta over one group of requests, keyed by
  [repeat, config, concurrency, group]
- divergence: at temperature 0, where an output first differs from the baseline's, with the
  target's top-2 logit margin there
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

REQUESTS = "requests.jsonl"


def request_key(repeat: int, prompt_id: str, config: str, concurrency: int) -> str:
    return json.dumps([repeat, prompt_id, config, concurrency])


@dataclass(slots=True)
class Results:
    meta: dict | None = None
    sessions: list[dict] = field(default_factory=list)
    requests: dict[str, dict] = field(default_factory=dict)  # key -> record; the first one wins
    servers: dict[str, dict] = field(default_factory=dict)  # [repeat, config, concurrency, group] -> record
    divergences: dict[str, dict] = field(default_factory=dict)  # request key -> record

    @staticmethod
    def load(path: str | Path) -> Results:
        """Read a results file (a run directory's, or its gzipped archive `requests.jsonl.gz` when
        the plain file is absent); a torn last line (the run was killed mid-write) is skipped."""
        out = Results()
        p = Path(path)
        if p.is_dir():
            p = p / REQUESTS
            p = _archived(p) or p
        if not p.exists():
            return out
        raw = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
        lines = raw.decode("utf-8").splitlines()
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                if i == len(lines) - 1:
                    continue
                raise ValueError(f"{p} line {i + 1} is not JSON") from None
            out.add(r)
        return out

    def add(self, r: dict) -> None:
        kind = r.get("kind")
        if kind == "meta":
            self.meta = self.meta or r
        elif kind == "session":
            self.sessions.append(r)
        elif kind == "request":
            self.requests.setdefault(r["key"], r)
        elif kind == "server":
            self.servers.setdefault(r["key"], r)
        elif kind == "divergence":
            self.divergences.setdefault(r["key"], r)


def _archived(path: Path) -> Path | None:
    """A run's gzipped rows (`requests.jsonl.gz`) where its plain file is absent, else None."""
    gz = path.with_suffix(".jsonl.gz")
    return gz if not path.exists() and gz.exists() else None


class ResultsWriter:
    """Appends records, each flushed at once."""

    def __init__(self, out_dir: str | Path):
        self.path = Path(out_dir) / REQUESTS
        if _archived(self.path):
            raise ValueError(f"{out_dir} holds an archived run ({REQUESTS}.gz): gunzip it to add to it, "
                             "or write to another directory")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair()
        self._f = self.path.open("a", encoding="utf-8")

    def _repair(self) -> None:
        """Cut a torn last line, so the next record starts on a line of its own."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            self.path.write_bytes(data[: data.rfind(b"\n") + 1])

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_conditions(stored: dict, now: dict) -> None:
    """A resumed run must measure under the same conditions as the results it extends."""
    diff = sorted(k for k in set(stored) | set(now) if stored.get(k) != now.get(k))
    if diff:
        detail = "; ".join(f"{k}: stored {stored.get(k)!r}, now {now.get(k)!r}" for k in diff)
        raise ValueError(f"these results were measured under other conditions ({detail}); "
                         "use another output directory")
