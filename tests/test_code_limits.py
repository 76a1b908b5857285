"""Every source file stays readable: at most 400 lines per file and 80 lines per function in the
packages, tests and studies (STYLE.md: a file that passes ~400 lines is asking to be split)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("parsim", "executor", "calibration", "tests", "studies")
MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 80


def _sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def test_no_file_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in _sources() if (n := p.read_text().count("\n")) > MAX_FILE_LINES}
    assert not long, long


def test_no_function_over_80_lines():
    long = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = lines
    assert not long, long


def test_the_checks_see_the_packages_and_measure_a_function():
    assert len(_sources()) > 150
    tree = ast.parse("def f():\n    a = 1\n    return a\n")
    f = tree.body[0]
    assert f.end_lineno - f.lineno + 1 == 3
