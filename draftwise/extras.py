"""Optional packages and the extra that installs each (pyproject.toml's [project.optional-dependencies]).

A command that needs one which is missing ends in one line naming the extra, never a traceback:

    draftwise serve needs the server extra: pip install 'draftwise[server]' (missing: fastapi)

(run from a source checkout, the command installs that checkout with the running interpreter's pip:
`/path/.venv/bin/python -m pip install -e '/path[server]'`).
`require` checks up front where a command knows what it needs; `message` turns an ImportError caught at
the command line's boundary (cli.main) into that line, or None when the missing module is not optional.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

# top-level module -> the extra that installs it
EXTRAS = {
    "llama_cpp": "llama",
    "fastapi": "server",
    "uvicorn": "server",
    "prometheus_client": "server",
    "matplotlib": "bench",
    "llguidance": "grammar",
}


class MissingExtra(ImportError):
    """An optional package a command needs is not installed; str() is the one line to print."""

    def __init__(self, command: str, extra: str, module: str):
        self.command, self.extra, self.module = command, extra, module
        super().__init__(f"draftwise {command} needs the {extra} extra: {install_command(extra)} (missing: {module})",
                         name=module)


def install_command(extra: str) -> str:
    """The pip command installing `extra`: into this checkout, with this interpreter's pip, when draftwise
    runs from a checkout (scripts/setup.sh's editable install), else from the package index."""
    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file():
        return f"{sys.executable} -m pip install -e '{root}[{extra}]'"
    return f"pip install 'draftwise[{extra}]'"


def missing(*modules: str) -> str | None:
    """The first of `modules` that cannot be imported, else None: its name, or "fastapi's dependency
    starlette" when it is there but a package it needs is not."""
    for m in modules:
        try:
            importlib.import_module(m)
        except ImportError as e:
            dep = (e.name or m).split(".")[0]
            return m if dep == m else f"{m}'s dependency {dep}"
    return None


def require(command: str, extra: str) -> None:
    """Raise MissingExtra unless every module of `extra` imports."""
    m = missing(*(mod for mod, e in EXTRAS.items() if e == extra))
    if m is not None:
        raise MissingExtra(command, extra, m)


def message(command: str, exc: BaseException) -> str | None:
    """The one line for an ImportError of an optional module (or of a package one of them needs,
    named by the optional module being imported), else None (a real bug: let it propagate)."""
    if isinstance(exc, MissingExtra):
        return str(exc)
    if not isinstance(exc, ImportError):
        return None
    top = (exc.name or "").split(".")[0]
    if top in EXTRAS:
        return str(MissingExtra(command, EXTRAS[top], top))
    # an optional package that is installed but broken (a dependency of it missing): name the package
    tb = exc.__traceback__
    while tb is not None:
        mod = tb.tb_frame.f_globals.get("__name__", "").split(".")[0]
        if mod in EXTRAS:
            return str(MissingExtra(command, EXTRAS[mod], f"{mod}'s dependency {exc.name}"))
        tb = tb.tb_next
    return None


def note_no_plots(command: str) -> str | None:
    """For reports: the line saying plots were left out, or None when matplotlib imports."""
    m = missing("matplotlib")
    if m is None:
        return None
    return f"draftwise {command}: the report has no plots: they need the bench extra: {install_command('bench')} (missing: {m})"


def warn_no_plots(command: str) -> None:
    line = note_no_plots(command)
    if line is not None:
        print(line, file=sys.stderr)
