"""Training text for `draftwise train-head`: the target's own answers to instructions this module
writes, and local code and documentation. Nothing here reads draftwise's evaluation data
(draftwise/data) or anything the benchmarks use.

Instructions (`instructions`): 32 hand-written ones, then, in a fixed order, tasks composed from
the templates and topics below (writing, role-play, explanation, questions, code), requests to
summarise a passage of an installed package's documentation, and requests to edit a function of
Python's standard library. The answers are the target's greedy output, generated in batches and
appended to a file as each finishes, so an interrupted run keeps them.
"""
from __future__ import annotations

import ast
import json
import random
import re
import sysconfig
from pathlib import Path

INSTRUCTIONS = (
    "Explain what a hash table is and when to use one.", "Write a short story about a lighthouse keeper.",
    "Give three tips for writing clear emails.", "What causes the seasons on Earth?",
    "Write a Python function that checks whether a string is a palindrome.", "Summarise the plot of a heist film you invent.",
    "Describe how a bicycle gear system works.", "What is the difference between a list and a tuple in Python?",
    "Write a polite note declining a meeting invitation.", "Explain recursion to a beginner with an example.",
    "Compare trains and planes for a 500 km trip.", "Write a haiku sequence about autumn rain.",
    "How does compound interest work? Give a worked example.", "Write a SQL query that finds duplicate emails in a users table.",
    "Describe a day in the life of a medieval baker.", "What are good habits for learning a new language?",
    "Explain the difference between TCP and UDP.", "Write a JavaScript function that debounces another function.",
    "Give advice to someone starting their first job.", "Explain photosynthesis in simple terms.",
    "Write a product description for a solar-powered lamp.", "What is Big-O notation? Explain with examples.",
    "Write a dialogue between a detective and a witness.", "How do vaccines train the immune system?",
    "Write a bash script that backs up a directory with a timestamp.", "Explain what an API is to a non-programmer.",
    "Describe the water cycle step by step.", "Write a cover letter opening for a data analyst role.",
    "What are the pros and cons of remote work?", "Explain how binary search works and write it in C.",
    "Write a limerick about a forgetful robot.", "How should I structure a presentation for a technical audience?",
)

TASKS = (  # {t}: a topic
    "Write a short story about {t}.", "Explain {t} to a curious twelve-year-old.",
    "Write a persuasive essay paragraph about why {t} matters.", "Write a poem about {t}.",
    "You are a museum guide. Tell a group of visitors about {t}.",
    "Pretend you are a scientist from the year 1900 reacting to {t}.",
    "How did {t} shape the society around it? Answer as a historian would.",
    "Give five questions a student might ask about {t}, each with a short answer.",
    "What are common misconceptions about {t}?", "List the advantages and drawbacks of {t}.",
    "Write an email to a friend describing your weekend learning about {t}.",
    "Write a news report about a surprising discovery involving {t}.",
    "Write a dialogue between two colleagues who disagree about {t}.",
    "What ethical questions does {t} raise?", "Write the opening of a blog post about {t}.",
    "Write a Python program that simulates or models something about {t}, with comments.",
    "Describe {t} in exactly three paragraphs: what it is, why it matters, what comes next.",
    "Act as a job interviewer and ask me three questions about {t}, then give model answers.",
)

TOPICS = (
    "volcanoes", "the printing press", "honey bees", "black holes", "the Roman road network", "jazz music",
    "urban gardening", "the invention of the telephone", "coral reefs", "electric cars", "chess openings",
    "the Silk Road", "sleep and memory", "public libraries", "the stock market", "glaciers", "origami",
    "the human heart", "wind turbines", "ancient Egyptian writing", "video game design", "rainforests",
    "the French Revolution", "quantum computers", "coffee farming", "migrating birds", "bridges",
    "the Olympic Games", "recycling plastics", "the moon landing", "street food", "earthquakes",
    "the history of money", "open-source software", "desert ecosystems", "mountain climbing",
    "the immune system", "renewable energy policy", "the Renaissance", "container shipping",
    "machine translation", "the water supply of a city", "classical music", "space telescopes",
    "the invention of paper", "antibiotics", "board games", "lighthouses", "the Industrial Revolution",
    "password security", "octopuses", "minimalist living", "the Great Wall of China", "solar eclipses",
    "online education", "fermentation", "the postal service", "sea turtles", "typography", "robot vacuum cleaners",
)

EDITS = (  # {f}: a function of the standard library
    "Add type hints and a docstring to this Python function:\n\n```python\n{f}\n```",
    "Rename the variables in this Python function to be more descriptive:\n\n```python\n{f}\n```",
    "Rewrite this Python function so that it is easier to read, keeping its behaviour:\n\n```python\n{f}\n```",
    "Explain what this Python function does, line by line:\n\n```python\n{f}\n```",
)

SUMMARISE = (  # {p}: a passage of package documentation
    "Summarise the following text in a few sentences:\n\n{p}",
    "Read the passage below and answer: what is its main point, and who is it for?\n\n{p}",
)


def local_texts() -> list[tuple[str, str]]:
    """(source, text) of Python's standard library source and the installed packages' documentation
    (Markdown / reST files and the long descriptions of their metadata), interleaved code and
    documentation so that any prefix of the list mixes both, in a fixed order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    purelib = Path(sysconfig.get_paths()["purelib"])
    code = [(f"stdlib/{p.name}", p.read_text(errors="ignore")) for p in sorted(stdlib.glob("*.py"))]
    docs = []
    for p in sorted(list(purelib.rglob("*.md")) + list(purelib.rglob("*.rst")) + list(purelib.glob("*.dist-info/METADATA"))):
        if "draftwise" in p.name or "draftwise" in str(p.parent.name) or p.stat().st_size <= 2000:
            continue
        text = p.read_text(errors="ignore")
        if p.name == "METADATA":  # the long description after the header block
            text = text.split("\n\n", 1)[1] if "\n\n" in text else ""
        if len(text) > 2000:
            docs.append((f"docs/{p.relative_to(purelib)}", text))
    return [t for pair in zip(code, docs) for t in pair] + code[len(docs):] + docs[len(code):]


def _prose(p: str) -> bool:
    """A paragraph of running text: starts with a capital, no markup or links, mostly letters."""
    return (p[0].isupper() and "<" not in p and "http" not in p and "License" not in p and p.count("\n") <= 12
            and sum(c.isalpha() or c.isspace() for c in p) >= 0.9 * len(p))


def _passages(texts: list[tuple[str, str]], n: int) -> list[str]:
    """Up to n prose passages (600-1800 characters of paragraphs, little code) of the documentation."""
    out = []
    for src, text in texts:
        if not src.startswith("docs/"):
            continue
        paras = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
        buf = ""
        for p in paras:
            if not _prose(p):
                continue  # code, markup, tables, headings, lists
            buf = f"{buf}\n\n{p}" if buf else p
            if len(buf) >= 600:
                if len(buf) <= 1800:
                    out.append(buf)
                buf = ""
                break  # one passage per file: variety
        if len(out) >= n:
            break
    return out


def _functions(texts: list[tuple[str, str]], n: int) -> list[str]:
    """Up to n top-level functions of 6-30 lines from the standard library source, one per module."""
    out = []
    for src, text in texts:
        if not src.startswith("stdlib/"):
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        lines = text.splitlines()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and 6 <= node.end_lineno - node.lineno + 1 <= 30:
                out.append("\n".join(lines[node.lineno - 1: node.end_lineno]))
                break
        if len(out) >= n:
            break
    return out


def instructions(n: int, texts: list[tuple[str, str]] | None = None) -> list[str]:
    """The first n instructions: INSTRUCTIONS, then composed tasks, summaries and edits (3 : 1 : 1),
    in a fixed order."""
    if n <= len(INSTRUCTIONS):
        return list(INSTRUCTIONS[:n])
    texts = local_texts() if texts is None else texts
    rng = random.Random(0)
    tasks = [t.format(t=topic) for t in TASKS for topic in TOPICS]
    rng.shuffle(tasks)
    summ = [SUMMARISE[i % len(SUMMARISE)].format(p=p) for i, p in enumerate(_passages(texts, n))]
    edits = [EDITS[i % len(EDITS)].format(f=f) for i, f in enumerate(_functions(texts, n))]
    it = iter(tasks)
    streams = [it, it, it, iter(summ), iter(edits)]
    out = list(INSTRUCTIONS)
    while len(out) < n:
        before = len(out)
        for s in streams:
            item = next(s, None)
            if item is not None and len(out) < n:
                out.append(item)
        if len(out) == before:
            raise ValueError(f"only {len(out)} instructions can be composed, asked for {n}")
    return out


def answers(runner, tok, n: int, max_tokens: int, path: Path, log, batch: int = 16,
            texts: list[tuple[str, str]] | None = None) -> list[tuple[str, list[int]]]:
    """The target's greedy answers to the first n instructions, as chat token ids (prompt + answer),
    `batch` at a time; each finished answer is appended to `path` (JSON lines) and a rerun
    generates only the missing ones. `runner`: a runner, or a function returning one, called only
    when answers are missing."""
    from draftwise.engine import Engine

    done: dict[int, list[int]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                done[d["i"]] = d["ids"]
    todo = [(i, text) for i, text in enumerate(instructions(n, texts)) if i not in done]
    if todo:
        eng = Engine(runner() if callable(runner) else runner, tok, max_running=batch)
        with path.open("a") as f:
            def keep(i: int, prompt: list[int]):
                def deliver(chunk) -> None:
                    if isinstance(chunk, BaseException):
                        raise chunk
                    if chunk.result is not None:
                        done[i] = prompt + chunk.result.token_ids
                        f.write(json.dumps({"i": i, "ids": done[i]}) + "\n")
                        f.flush()
                        log(f"answers: {len(done)}/{n}")
                return deliver
            reqs = []
            for i, text in todo:
                ids = tok.apply_chat([{"role": "user", "content": text}])
                reqs.append(eng.request(ids, keep(i, ids), max_tokens=max_tokens))
            eng.run_batch(reqs)
    return [(f"answer/{i}", done[i]) for i in sorted(done) if i < n]
