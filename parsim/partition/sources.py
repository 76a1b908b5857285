"""Where a cost graph comes from: a parsim ModelSpec, or a ``pkg.module:factory`` module.

* A ModelSpec (preset, model YAML, HF config.json) is cut at transformer-layer starts. Its
  graph is either ``traced`` -- the executor's reference decoder (``parsim.executor.model``,
  the model ``parsim execute`` runs) traced on the meta device -- or ``analytic`` -- the
  simulator's own cost model (``spec_graph``). ``auto`` traces when torch is installed and the
  plan has no tensor parallelism (the traced model is one device's full layer), else analytic.
* ``pkg.module:factory`` (or ``path/to/file.py:factory``) names a callable returning either
  ``(module, example_inputs)`` or a module with an ``example_inputs()`` method; example inputs
  are a tensor, a tuple of positional tensors or a dict of keyword tensors holding one
  microbatch. If the callable takes a ``batch_size`` argument it gets the plan's ``mbs``.
  It is called under ``torch.device("meta")``, so modules built inside allocate no weights.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from parsim.specs import ClusterSpec, ModelSpec, Plan, SpecError, load_model

from .graph import CostGraph
from .spec_graph import analytic_graph

GRAPHS = ("auto", "traced", "analytic")
LAYER_PATH = re.compile(r"^layers\.(\d+)(\.|$)")   # executor.model: StageModule.layers[str(i)]


@dataclass(frozen=True)
class ModelSource:
    """A model to partition: a ModelSpec or a factory reference ``pkg.module:factory``."""
    spec: ModelSpec | None
    factory: str | Callable | None

    @property
    def name(self) -> str:
        if self.spec is not None:
            return self.spec.name
        return self.factory if isinstance(self.factory, str) else getattr(self.factory, "__qualname__", "module")


def resolve_source(model: ModelSpec | str | Callable) -> ModelSource:
    """A ModelSpec (preset / YAML / HF config) if ``model`` is one, else a factory: a
    ``pkg.module:factory`` reference or the callable itself."""
    if isinstance(model, ModelSpec):
        return ModelSource(model, None)
    if callable(model):
        return ModelSource(None, model)
    text = str(model)
    try:
        return ModelSource(load_model(text), None)
    except SpecError:
        if ":" not in text:
            raise
    mod, _, attr = text.rpartition(":")
    if not mod or not attr.isidentifier():
        raise SpecError("model", text, "a preset, a model YAML, a HF config.json, or pkg.module:factory")
    return ModelSource(None, text)


def build_graph(source: ModelSource, plan: Plan, cluster: ClusterSpec, graph: str = "auto") -> CostGraph:
    if graph not in GRAPHS:
        raise SpecError("graph", graph, f"one of {', '.join(GRAPHS)}")
    if source.spec is not None:
        if graph == "auto":
            graph = "traced" if _has_torch() and plan.tp == 1 else "analytic"
        if graph == "analytic":
            return analytic_graph(source.spec, plan, cluster)
        _traced_plan_ok(plan)
        return _trace_reference(source.spec, plan, cluster)
    if graph == "analytic":
        raise SpecError("graph", graph, "traced (a torch module has no analytic cost model)")
    _traced_plan_ok(plan)
    module, inputs = load_factory(source.factory, plan.mbs)
    from .trace import trace_module
    return trace_module(module, inputs, name=source.name, cluster=cluster, dtype=plan.dtype)


def _traced_plan_ok(plan: Plan) -> None:
    if not _has_torch():
        raise SpecError("graph", "traced", "torch installed (pip install 'parsim[torch]'), or --graph analytic")
    if plan.tp != 1:
        raise SpecError("tp", plan.tp, "1 for a traced graph (it prices one device's full layers); "
                        "use --graph analytic for tensor parallelism")


def _has_torch() -> bool:
    return importlib.util.find_spec("torch") is not None


def _trace_reference(spec: ModelSpec, plan: Plan, cluster: ClusterSpec) -> CostGraph:
    import torch

    from parsim.executor.model import StageModule

    from .trace import trace_module
    with torch.device("meta"):
        module = StageModule(spec, 0, spec.layers, is_first=True, is_last=True)
        tokens = torch.zeros(plan.mbs, spec.seq_len, dtype=torch.long)
    return trace_module(module, (tokens, tokens.clone()), name=spec.name, cluster=cluster, dtype=plan.dtype,
                        unit_of=_layer_of, layers=spec.layers)


def _layer_of(path: str) -> int | None:
    m = LAYER_PATH.match(path)
    return int(m.group(1)) if m else None


def load_factory(reference: str | Callable, batch_size: int = 1):
    """Call the factory (``pkg.module:factory`` or a callable) under the meta device; returns
    (module, example_inputs)."""
    import torch

    factory = reference if callable(reference) else _import_factory(reference)
    kwargs = {}
    try:
        if "batch_size" in inspect.signature(factory).parameters:
            kwargs["batch_size"] = batch_size
    except (TypeError, ValueError):
        pass
    with torch.device("meta"):
        made = factory(**kwargs)
        if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
            return made
        if isinstance(made, torch.nn.Module) and callable(getattr(made, "example_inputs", None)):
            return made, made.example_inputs()
    raise SpecError("model", str(reference), "a factory returning (module, example_inputs) or a module with "
                    "example_inputs()")


def _import_factory(reference: str) -> Callable:
    mod_name, _, attr = reference.rpartition(":")
    try:
        if mod_name.endswith(".py") or "/" in mod_name:
            path = Path(mod_name)
            spec = importlib.util.spec_from_file_location(path.stem, path)
            if spec is None or not path.exists():
                raise ImportError(f"no file {path}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))   # as `python -m` does: the working directory's packages
            module = importlib.import_module(mod_name)
        return getattr(module, attr)
    except (ImportError, AttributeError) as err:
        raise SpecError("model", reference, f"an importable pkg.module:factory ({err})") from None
