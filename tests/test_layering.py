"""The layers of DESIGN.md hold: no module imports a higher layer, engines do not import each
other, and the simulator imports without torch.

Every ``import`` statement of every module (module level and inside functions alike) is read
from the source with ``ast`` and resolved to the parsim module it names. Layers, lowest first:

    specs < schedules, trace < costs < engines (sim, fast, partition, executor, calibration)
          < plots < study < api < cli < the parsim package itself (and ``python -m parsim``)

``trace`` is the event schema every engine writes (DESIGN.md: the engines "meet only in the
Schedule IR and the Trace schema"), so it sits with ``schedules`` below ``costs``: engines and
costs may import it, it imports neither. A module may import its own package and any lower
layer; within a layer, packages do not import each other, except calibration, which uses the
executor's model and its initial weights, layer step, split backward, optimizer and mixed precision, host memory policy, launcher,
process groups and TP collective calls, and FSDP2's comm hooks (``ALLOWED``). The top layers are
ordered too: studies (validate) draw their charts with ``plots``, the Python API runs the studies,
and the CLI is a thin layer over the Python API.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# source folder -> the package it is installed as (pyproject.toml's package-dir)
PACKAGE_DIRS = {ROOT / "parsim": "parsim", ROOT / "executor": "parsim.executor",
                ROOT / "calibration": "parsim.calibration"}
LAYER = {"specs": 0, "schedules": 1, "trace": 1, "costs": 2,
         "sim": 3, "fast": 3, "partition": 3, "executor": 3, "calibration": 3,
         "plots": 4, "study": 5, "api": 6, "cli": 7, "": 8, "__main__": 8}
TORCH_FREE = ("specs", "schedules", "trace", "costs", "sim", "fast", "partition", "study", "plots", "api", "cli", "")
# (importing package, imported module): edges within a layer that the design allows
ALLOWED = {("calibration", "parsim.executor.model"), ("calibration", "parsim.executor.weights"),
           ("calibration", "parsim.executor.layer_probe"),
           ("calibration", "parsim.executor.host_alloc"), ("calibration", "parsim.executor.processes"),
           ("calibration", "parsim.executor.optimizer"), ("calibration", "parsim.executor.split_backward"),
           ("calibration", "parsim.executor.tp_communications"), ("calibration", "parsim.executor.zero"),
           ("calibration", "parsim.executor.parallel_dims")}
# (importing module, imported module): violations another helper is removing now; the
# coordinator deletes each entry once that helper's branch is merged (the test then holds it)
KNOWN: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGE_DIRS.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("").parts
            if folder.name == "parsim" and rel[0] in ("executor", "calibration"):
                continue
            name = ".".join((package, *rel))
            out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The parsim modules (or packages) ``name``'s import statements name."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".")
                parent = parts if is_package else parts[:-1]
                parent = parent[:len(parent) - (node.level - 1)]
                base = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:     # ``from pkg import module`` names the module
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {m for m in found if m == "parsim" or m.startswith("parsim.")}


def _package(module: str) -> str:
    """The layer key of a parsim module: its top-level subpackage ("" for parsim itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _violations() -> dict[tuple[str, str], str]:
    out = {}
    for name, path in sorted(MODULES.items()):
        src = _package(name)
        for target in sorted(_imports(name, path)):
            dst = _package(target)
            if dst == src:
                continue
            assert src in LAYER and dst in LAYER, f"{name} -> {target}: add the new package to LAYER"
            if LAYER[dst] > LAYER[src]:
                out[(name, target)] = f"imports a higher layer ({dst} above {src})"
            elif LAYER[dst] == LAYER[src] and (src, target) not in ALLOWED:
                out[(name, target)] = f"imports another package of its layer ({dst} beside {src})"
    return out


def test_no_module_imports_a_higher_layer_or_a_sibling_engine():
    found = _violations()
    new = {edge: why for edge, why in found.items() if edge not in KNOWN}
    assert not new, "\n".join(f"{a} -> {b}: {why}" for (a, b), why in sorted(new.items()))
    fixed = set(KNOWN) - set(found)
    assert not fixed, f"no longer violated, remove from KNOWN: {sorted(fixed)}"


def test_the_walk_sees_lazy_imports_and_resolves_relative_ones():
    # the checker itself: an import inside a function is an edge, ``from . import x`` is module x
    assert "parsim.fast.codes" in _imports("parsim.fast.evaluate", MODULES["parsim.fast.evaluate"])
    assert "parsim.executor.launch" in _imports("parsim.executor.entry", MODULES["parsim.executor.entry"])
    assert "parsim.executor.model" in _imports("parsim.api.search", MODULES["parsim.api.search"])
    assert len(MODULES) > 100 and "parsim.calibration.comm" in MODULES and "parsim.executor.worker" in MODULES


def test_simulator_modules_import_torch_only_inside_functions():
    """Module-level statements (class bodies included) of the torch-free layers never import torch."""
    offenders = []
    for name, path in MODULES.items():
        if _package(name) not in TORCH_FREE:
            continue
        pending = list(ast.parse(path.read_text()).body)
        while pending:
            node = pending.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or _type_checking_only(node):
                continue
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "torch" for a in node.names):
                offenders.append(name)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
                offenders.append(name)
            pending.extend(ast.iter_child_nodes(node))
    assert not offenders


def _type_checking_only(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` (its imports are for annotations; they never run)."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def test_every_simulator_module_imports_without_torch():
    """Importing all of them (with what they import, executor modules included) loads no torch."""
    names = sorted(n for n in MODULES if _package(n) in TORCH_FREE and not n.endswith("__main__"))
    code = ("import importlib, sys\n"
            f"for name in {names!r}:\n"
            "    importlib.import_module(name)\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"
