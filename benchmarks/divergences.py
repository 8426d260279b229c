"""Shared by the benchmark scripts: append, once per (prompt, configuration), the first divergence
of each output from draftwise plain decoding, with the target's top-2 logit margins there."""
from __future__ import annotations

import json
from pathlib import Path

from draftwise.compare import divergence_report


def append_divergences(out: Path, target, tok, prompts: dict) -> None:
    rows = [json.loads(line) for line in out.open()]
    base = {r["prompt_id"]: r["tokens"] for r in rows if r["config"] == "dw_plain"}
    seen = {(r["prompt_id"], r["config"]) for r in rows}
    with out.open("a") as f:
        for r in rows:
            pid, name = r["prompt_id"], r["config"]
            if name.startswith("divergence:") or name == "dw_plain" or pid not in base or pid not in prompts:
                continue
            if (pid, f"divergence:{name}") in seen:
                continue
            div = divergence_report(target, prompts[pid].token_ids(tok), base[pid], r["tokens"])
            f.write(json.dumps({"prompt_id": pid, "config": f"divergence:{name}",
                                "divergence": div.to_dict() if div else None}) + "\n")
            f.flush()  # an interrupted check keeps what it found
