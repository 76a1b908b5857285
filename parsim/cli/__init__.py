"""The ``parsim`` command line. Each command is a module in this package exposing
``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``; they are found by
name, so adding a command is adding a file.

Bad input (SpecError) prints one message naming the field, the value and what is allowed,
and exits with code 2. Ctrl-C exits 130. For the commands that start processes
(``SIGTERM_AS_EXCEPTION``: the executor's ranks, calibration's benchmark jobs), SIGTERM is
raised as an exception in the main thread (``Terminated``), so the same clean-up runs (the
ranks are killed, partial outputs removed) and the command exits 143 = 128 + 15, the status a
shell reports for a process ended by SIGTERM, with one line and no traceback. The other
commands keep SIGTERM's default action -- they end at once, silently, even inside a long
compiled loop (a Python handler would wait for the loop) -- and start no process to clean up.
"""
from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import signal
import sys
import threading
import warnings
from contextlib import contextmanager

from parsim.specs import SpecError

_NOT_COMMANDS = {"common"}
SIGTERM_AS_EXCEPTION = {"execute", "validate", "calibrate", "demo"}


def _command_modules() -> dict[str, object]:
    mods = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name in _NOT_COMMANDS:
            continue
        mods[info.name] = importlib.import_module(f"{__name__}.{info.name}")
    return mods


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors also exit 2, with one line
        message = " ".join(message.split())
        if len(message) > 400:      # e.g. a pasted 5000-digit number in an "invalid int value" message
            message = message[:397] + "..."
        self.exit(2, f"parsim: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="parsim", description="Simulate and execute distributed transformer training plans.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, mod in sorted(_command_modules().items()):
        p = sub.add_parser(name.replace("_", "-"), help=mod.HELP, description=mod.HELP)   # plan_run: plan-run
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread: clean-up runs as for Ctrl-C."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


@contextmanager
def _sigterm_as_exception(wanted: bool):
    """While a command runs, SIGTERM raises ``Terminated`` (only the main thread can set handlers)."""
    if not wanted or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


OWN_WARNINGS = ("parsim", "calibration")     # modules whose warning categories are parsim's


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """parsim's own warnings (a calibration fit kept as a bound, a busy machine, a profile
    measured under another memory policy) as one line, ``parsim: warning: ...``, without
    Python's file, line and source excerpt; any other library's as Python prints them."""
    stream = sys.stderr if file is None else file
    if category.__module__.split(".")[0] in OWN_WARNINGS:
        print(f"parsim: warning: {message}", file=stream)
    else:
        stream.write(warnings.formatwarning(message, category, filename, lineno, line))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with warnings.catch_warnings(), _sigterm_as_exception(args.command in SIGTERM_AS_EXCEPTION):
            warnings.simplefilter("default")
            warnings.showwarning = _show_warning       # catch_warnings puts Python's back
            return int(args._run(args) or 0)
    except Terminated:
        print("parsim: terminated (SIGTERM)", file=sys.stderr)
        return 143
    except SpecError as err:
        if getattr(args, "json", False):
            print(json.dumps({"error": str(err), "field": err.field}))
        print(f"parsim: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("parsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:          # e.g. `parsim ... | head`: the reader left, nothing is wrong
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def entry() -> None:
    sys.exit(main())
