"""Writes code_rewrites_2026_12_07.jsonl: whole-function rewrites sent as a coding agent sends them,
the original function in the request and as its `prediction` (OpenAI's Predicted Outputs). The
functions and edits were written for this workload (none comes from a dataset draftwise was tuned
on). Run: .venv/bin/python benchmarks/workloads/code_rewrites.py"""
import json
from pathlib import Path

FUNCTIONS = {
    "parse-config": ("Add type hints to the function's parameters and return value", '''def parse_config(path, defaults=None, strict=False):
    values = dict(defaults or {})
    seen = set()
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "=" not in line:
                if strict:
                    raise ValueError(f"{path}:{number}: expected key = value, got {line!r}")
                continue
            key, _, value = line.partition("=")
            key, value = key.strip().lower(), value.strip()
            if key in seen and strict:
                raise ValueError(f"{path}:{number}: {key} is set twice")
            seen.add(key)
            if value.lower() in ("true", "yes", "on"):
                values[key] = True
            elif value.lower() in ("false", "no", "off"):
                values[key] = False
            elif value.isdigit():
                values[key] = int(value)
            else:
                values[key] = value.strip('"')
    return values
'''),
    "moving-average": ("Rename the variable `window` to `span` everywhere in the function", '''def moving_average(samples, window, skip_missing=True):
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    averages = []
    total = 0.0
    count = 0
    queue = []
    for value in samples:
        if value is None:
            if skip_missing:
                averages.append(None)
                continue
            value = 0.0
        queue.append(value)
        total += value
        count += 1
        if len(queue) > window:
            total -= queue.pop(0)
            count -= 1
        if count < window:
            averages.append(None)
        else:
            averages.append(total / window)
    return averages
'''),
    "merge-intervals": ("Add a docstring that explains the arguments, the return value and an example", '''def merge_intervals(intervals, gap=0):
    if not intervals:
        return []
    ordered = sorted(intervals, key=lambda pair: (pair[0], pair[1]))
    merged = [list(ordered[0])]
    for start, end in ordered[1:]:
        if start > end:
            raise ValueError(f"interval ({start}, {end}) ends before it starts")
        last = merged[-1]
        if start <= last[1] + gap:
            last[1] = max(last[1], end)
        else:
            merged.append([start, end])
    return [tuple(pair) for pair in merged]
'''),
    "retry-request": ("Log each failed attempt with the `logging` module (a module-level logger) instead of print", '''def fetch_with_retry(session, url, attempts=3, backoff=0.5, timeout=10.0):
    delay = backoff
    last_error = None
    for attempt in range(1, attempts + 1):
        try:
            response = session.get(url, timeout=timeout)
            if response.status_code >= 500:
                print(f"attempt {attempt}: server error {response.status_code} from {url}")
                last_error = RuntimeError(f"HTTP {response.status_code}")
            else:
                response.raise_for_status()
                return response.json()
        except (ConnectionError, TimeoutError) as error:
            print(f"attempt {attempt}: {error!r} from {url}")
            last_error = error
        if attempt < attempts:
            time.sleep(delay)
            delay *= 2
    raise RuntimeError(f"{url} failed after {attempts} attempts") from last_error
'''),
    "inventory-report": ("Add a `currency` parameter (default \"EUR\") and show it after every amount in the report", '''def inventory_report(items, low_stock=5):
    lines = ["name                 qty     price     value"]
    total_value = 0.0
    low = []
    for item in sorted(items, key=lambda entry: entry["name"].lower()):
        quantity = int(item.get("quantity", 0))
        price = float(item.get("price", 0.0))
        value = quantity * price
        total_value += value
        lines.append(f"{item['name']:<20} {quantity:>4} {price:>9.2f} {value:>9.2f}")
        if quantity <= low_stock:
            low.append(item["name"])
    lines.append("-" * 45)
    lines.append(f"{'total':<20} {'':>4} {'':>9} {total_value:>9.2f}")
    if low:
        lines.append("")
        lines.append("low stock: " + ", ".join(low))
    return "\\n".join(lines)
'''),
    "tokenize-expression": ("Make the function also accept `**` as a single power operator token", '''def tokenize(expression):
    tokens = []
    i = 0
    while i < len(expression):
        char = expression[i]
        if char.isspace():
            i += 1
            continue
        if char.isdigit() or char == ".":
            start = i
            while i < len(expression) and (expression[i].isdigit() or expression[i] == "."):
                i += 1
            text = expression[start:i]
            if text.count(".") > 1:
                raise SyntaxError(f"bad number {text!r} at {start}")
            tokens.append(("number", float(text)))
            continue
        if char.isalpha() or char == "_":
            start = i
            while i < len(expression) and (expression[i].isalnum() or expression[i] == "_"):
                i += 1
            tokens.append(("name", expression[start:i]))
            continue
        if char in "+-*/()":
            tokens.append(("op", char))
            i += 1
            continue
        raise SyntaxError(f"unexpected {char!r} at {i}")
    return tokens
'''),
    "group-by-day": ("Use `collections.defaultdict` instead of `setdefault`, keeping the behaviour the same", '''def group_events_by_day(events, tz_offset_hours=0):
    days = {}
    for event in events:
        stamp = event["timestamp"] + tz_offset_hours * 3600
        day = datetime.utcfromtimestamp(stamp).date().isoformat()
        bucket = days.setdefault(day, {"count": 0, "users": set(), "kinds": {}})
        bucket["count"] += 1
        bucket["users"].add(event["user"])
        kind = event.get("kind", "other")
        bucket["kinds"].setdefault(kind, 0)
        bucket["kinds"][kind] += 1
    summary = []
    for day in sorted(days):
        bucket = days[day]
        top = max(bucket["kinds"].items(), key=lambda pair: pair[1])[0]
        summary.append({"day": day, "events": bucket["count"], "users": len(bucket["users"]),
                        "top_kind": top})
    return summary
'''),
    "validate-user": ("Collect every problem and raise one ValueError listing them all, instead of raising at the first", '''def validate_user(record):
    if not isinstance(record, dict):
        raise ValueError("a user record must be a dict")
    name = record.get("name", "")
    if not name or not name.strip():
        raise ValueError("name is required")
    if len(name) > 80:
        raise ValueError("name is longer than 80 characters")
    email = record.get("email", "")
    if "@" not in email or email.startswith("@") or email.endswith("@"):
        raise ValueError(f"email {email!r} is not valid")
    age = record.get("age")
    if age is not None:
        if not isinstance(age, int):
            raise ValueError("age must be a whole number")
        if age < 0 or age > 150:
            raise ValueError(f"age {age} is out of range")
    roles = record.get("roles", [])
    unknown = [role for role in roles if role not in ("admin", "editor", "viewer")]
    if unknown:
        raise ValueError(f"unknown roles: {', '.join(unknown)}")
    return True
'''),
}


def rows():
    for name, (edit, code) in FUNCTIONS.items():
        ask = f"{edit}. Return the whole rewritten function in one Python code block.\n\n```python\n{code}```"
        yield {"id": f"rewrite-{name}", "category": "code-rewrite", "messages": [{"role": "user", "content": ask}],
               "prediction": f"```python\n{code}```"}


if __name__ == "__main__":
    out = Path(__file__).with_name("code_rewrites_2026_12_07.jsonl")
    out.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    print(out)
