"""Where a cost graph comes from: a parsim ModelSpec, or a ``pkg.module:factory`` module.

* A ModelSpec (preset, model YAML, HF config.json) is cut at transformer-layer starts. Its
  graph is either ``traced`` -- a ``reference_model`` the caller passes in, traced on the meta
  device (the CLI passes the executor's decoder, ``parsim.executor.model.reference_model``, the
  model ``parsim execute`` runs; the partitioner does not import the executor) -- or
  ``analytic`` -- the simulator's own cost model (``spec_graph``). ``auto`` traces when a
  reference model is given, torch is installed and the plan has no tensor parallelism (the
  traced model is one device's full layer), else analytic. A reference model is called as
  ``reference_model(spec, batch_size)`` and returns ``(module, example_inputs)`` whose
  transformer layers are the submodules ``layers.<i>``.
* ``pkg.module:factory`` (or ``path/to/file.py:factory``) names a callable returning either
  ``(module, example_inputs)`` or a module with an ``example_inputs()`` method; example inputs
  are a tensor, a tuple of positional tensors or a dict of keyword tensors holding one
  microbatch. If the callable takes a ``batch_size`` argument it gets the plan's ``mbs``.
  It is called under ``torch.device("meta")``, so modules built inside allocate no weights.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from parsim.costs.host import rank_cache_bytes
from parsim.specs import ClusterSpec, ModelSpec, Plan, SpecError, load_model

from .graph import CostGraph
from .spec_graph import analytic_graph

GRAPHS = ("auto", "traced", "analytic")
LAYER_PATH = re.compile(r"^layers\.(\d+)(\.|$)")   # a reference model's layer i (executor.model: StageModule.layers[str(i)])
# (spec, batch_size) -> (module, example_inputs): the model a ModelSpec is traced as
ReferenceModel = Callable[[ModelSpec, int], tuple]


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


def build_graph(source: ModelSource, plan: Plan, cluster: ClusterSpec, graph: str = "auto",
                reference_model: ReferenceModel | None = None) -> CostGraph:
    if graph not in GRAPHS:
        raise SpecError("graph", graph, f"one of {', '.join(GRAPHS)}")
    if source.spec is not None:
        if graph == "auto":
            graph = "traced" if reference_model is not None and _has_torch() and plan.tp == 1 else "analytic"
        if graph == "analytic":
            return analytic_graph(source.spec, plan, cluster)
        _traced_plan_ok(plan)
        if reference_model is None:
            raise SpecError("graph", "traced", "a reference_model to trace a ModelSpec as (the CLI passes the "
                            "executor's, parsim.executor.model.reference_model), or graph=analytic")
        return _trace_reference(source.spec, plan, cluster, reference_model)
    if graph == "analytic":
        raise SpecError("graph", graph, "traced (a torch module has no analytic cost model)")
    _traced_plan_ok(plan)
    module, inputs = load_factory(source.factory, plan.mbs)
    from .trace import trace_module
    return trace_module(module, inputs, name=source.name, cluster=cluster, dtype=plan.dtype,
                        cache_bytes=rank_cache_bytes(cluster, plan.world_size))


def _traced_plan_ok(plan: Plan) -> None:
    if not _has_torch():
        raise SpecError("graph", "traced", "torch installed (pip install 'parsim[torch]'), or --graph analytic")
    if plan.tp != 1:
        raise SpecError("tp", plan.tp, "1 for a traced graph (it prices one device's full layers); "
                        "use --graph analytic for tensor parallelism")


def _has_torch() -> bool:
    return importlib.util.find_spec("torch") is not None


def _trace_reference(spec: ModelSpec, plan: Plan, cluster: ClusterSpec, reference_model: ReferenceModel) -> CostGraph:
    from .trace import trace_module

    module, inputs = load_factory(functools.partial(reference_model, spec), plan.mbs)
    return trace_module(module, inputs, name=spec.name, cluster=cluster, dtype=plan.dtype,
                        unit_of=_layer_of, layers=spec.layers, cache_bytes=rank_cache_bytes(cluster, plan.world_size))


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
