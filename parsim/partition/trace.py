"""Trace a ``torch.nn.Module`` into a ``CostGraph`` without real weights (torch imported lazily).

Merak (Lai et al. 2023, Sec. 4.1) traces the model with ``torch.fx`` on proxy tensors so that a
model larger than one device can be partitioned before any weight exists. Here:

1. the module and its example inputs move to the ``meta`` device (shapes, no storage);
2. ``torch.fx`` symbolic tracing makes the node list; a submodule that cannot be traced on
   its own (data-dependent Python control flow) becomes one leaf node instead of failing;
3. an ``fx.Interpreter`` runs the graph on the meta tensors node by node, recording every
   aten op each node dispatches (``aten_costs``), the tensors autograd saves for backward
   (``saved_tensors_hooks``; a storage counts once, for the first node that saves it), and the
   parameters it touches.

Graph inputs, and nodes computed only from inputs (no parameters), are *common* nodes:
available to every stage. A ``get_attr`` parameter belongs to every stage that uses it
(a weight shared by two stages, like tied embeddings, is held by both, as Megatron-LM does).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from parsim.specs import ClusterSpec, SpecError

from .aten_costs import aten_op, attention_op, attention_saved_bytes
from .graph import CostGraph, CostNode
from .spec_graph import pass_times

TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def trace_module(module, example_inputs, *, name: str, cluster: ClusterSpec, dtype: str = "fp32",
                 unit_of: Callable[[str], int | None] | None = None, layers: int | None = None,
                 cache_bytes: float | None = None) -> CostGraph:
    """The cost graph of ``module`` called on ``example_inputs`` (a tensor, a tuple of
    positional inputs, or a dict of keyword inputs), priced on ``cluster.device`` in ``dtype``.
    ``unit_of(module_path)`` names the layer a submodule belongs to (cuts go at layer starts;
    layers are the recomputation units); by default the layers are the children of the
    module's largest ``ModuleList``/``ModuleDict``/``Sequential`` (``find_layers``), and with
    none, cuts go wherever the fewest tensors are live. ``cache_bytes``: a rank's share of the
    last-level cache, which splits the memory-bound seconds as the engine does (``pass_times``)."""
    import torch
    import torch.fx as fx

    if unit_of is None:
        prefix, count = find_layers(module)
        if count:
            unit_of, layers = _child_index(module, prefix), count

    tdtype = getattr(torch, TORCH_DTYPES[dtype])
    module = module.to(device="meta")
    module = module.to(dtype=tdtype)
    module.train()
    args, kwargs = _split_inputs(example_inputs)
    to_meta = (lambda t: t.to(device="meta", dtype=tdtype if t.is_floating_point() else t.dtype)
               if isinstance(t, torch.Tensor) else t)
    args = [to_meta(a) for a in args]
    kwargs = {k: to_meta(v) for k, v in kwargs.items()}
    try:
        graph = _LeafFallbackTracer().trace(module)
    except Exception as err:   # noqa: BLE001 -- any tracing failure is the user's module
        raise SpecError("model", name, f"a module torch.fx can trace ({type(err).__name__}: {err})") from None
    gm = fx.GraphModule(module, graph)
    recorder = _Recorder(gm, module, cluster, dtype)
    recorder.run(*_placeholder_values(gm, args, kwargs))
    return recorder.cost_graph(name, unit_of, layers, cache_bytes)


def find_layers(module) -> tuple[str, int]:
    """(path, number of children) of the container holding the model's repeated layers: the
    ModuleList / ModuleDict / Sequential with >= 2 children and the most parameters
    (Merak, like Megatron-LM and torchtitan, cuts a model between its repeated blocks)."""
    import torch.nn as nn
    best, best_params = ("", 0), 0
    for path, m in module.named_modules():
        if isinstance(m, (nn.ModuleList, nn.ModuleDict, nn.Sequential)) and len(m) >= 2:
            params = sum(p.numel() for p in m.parameters())
            if params > best_params:
                best, best_params = (path, len(m)), params
    return best


def _child_index(module, prefix: str) -> Callable[[str], int | None]:
    container = module.get_submodule(prefix) if prefix else module
    index = {name: i for i, (name, _) in enumerate(container.named_children())}
    head = f"{prefix}." if prefix else ""

    def unit_of(path: str) -> int | None:
        if not path.startswith(head):
            return None
        return index.get(path[len(head):].split(".", 1)[0])

    return unit_of


def _split_inputs(example_inputs) -> tuple[list, dict]:
    import torch
    if isinstance(example_inputs, torch.Tensor):
        return [example_inputs], {}
    if isinstance(example_inputs, dict):
        return [], dict(example_inputs)
    if isinstance(example_inputs, (list, tuple)):
        return list(example_inputs), {}
    raise SpecError("example_inputs", type(example_inputs).__name__, "a tensor, a tuple of tensors or a dict of them")


def _placeholder_values(gm, args: list, kwargs: dict) -> list:
    values = []
    for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        if i < len(args):
            values.append(args[i])
        elif node.target in kwargs:
            values.append(kwargs[node.target])
        elif node.args:
            values.append(node.args[0])   # the forward's default value
        else:
            raise SpecError("example_inputs", node.target, "a value for every input of forward()")
    return values


def _LeafFallbackTracer():
    import torch.fx as fx

    class LeafFallbackTracer(fx.Tracer):
        """Traces into submodules where it can; a submodule that fails alone stays a leaf."""

        def __init__(self, cache: dict | None = None):
            super().__init__()
            self.cache = {} if cache is None else cache

        def is_leaf_module(self, m, qualname: str) -> bool:
            if super().is_leaf_module(m, qualname):
                return True
            if id(m) not in self.cache:
                try:
                    LeafFallbackTracer(self.cache).trace(m)
                    self.cache[id(m)] = False
                except Exception:   # noqa: BLE001 -- untraceable on its own: keep it whole
                    self.cache[id(m)] = True
            return self.cache[id(m)]

    return LeafFallbackTracer()


class _Recorder:
    """Runs the traced graph on meta tensors and records what every node costs."""

    def __init__(self, gm, module, cluster: ClusterSpec, dtype: str):
        import torch.fx as fx

        self.gm, self.device, self.dtype = gm, cluster.device, dtype
        self.param_name = {id(p): n for n, p in module.named_parameters()}
        self.param_numel = {n: float(p.numel()) for n, p in module.named_parameters()}
        self.param_storages = {p.untyped_storage()._cdata for p in module.parameters()}
        self.saved_owner: dict[int, str] = {}          # storage -> first node saving it
        self.saved_bytes: dict[str, float] = {}
        self.ops: dict[str, list] = {}
        self.params: dict[str, tuple[str, ...]] = {}
        self.outputs: dict[str, Any] = {}
        self.current = ""
        self.suppress = False
        recorder = self

        class Interp(fx.Interpreter):
            def run_node(self, n):
                recorder.current = n.name
                recorder.ops[n.name] = []
                recorder.params[n.name] = recorder._node_params(n)
                if n.op in ("call_function", "call_method", "call_module"):
                    try:
                        with recorder.recording():
                            out = super().run_node(n)
                    except (RuntimeError, NotImplementedError):
                        if n.op != "call_module":
                            raise
                        out = recorder.run_materialized(n, self)
                else:
                    out = super().run_node(n)
                recorder.outputs[n.name] = out
                return out

        self.interp = Interp(gm)

    def recording(self):
        import contextlib

        import torch
        stack = contextlib.ExitStack()
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t))
        stack.enter_context(_AttentionMode(self))
        stack.enter_context(_DispatchRecorder(self))
        return stack

    def run_materialized(self, n, interp):
        """A leaf that cannot run on meta tensors (it reads tensor values, e.g. ``if x.sum() > 0``)
        runs once for real on zero-filled CPU inputs with uninitialised weights: only this
        module's weights are allocated. Its cost is that of the branch the zeros take."""
        import copy

        import torch
        real = copy.deepcopy(self.gm.get_submodule(n.target)).to_empty(device="cpu")
        self.param_storages |= {p.untyped_storage()._cdata for p in real.parameters()}

        def to_cpu(x):
            if isinstance(x, torch.Tensor):
                return torch.zeros(x.shape, dtype=x.dtype).requires_grad_(x.requires_grad)
            return x

        args, kwargs = interp.fetch_args_kwargs_from_env(n)
        args = torch.utils._pytree.tree_map(to_cpu, args)
        kwargs = torch.utils._pytree.tree_map(to_cpu, kwargs)
        self.ops[n.name] = []
        self.saved_bytes.pop(n.name, None)
        with self.recording():
            out = real(*args, **kwargs)
        return torch.utils._pytree.tree_map(
            lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, out)

    def run(self, *values) -> None:
        import torch
        with torch.enable_grad():
            self.interp.run(*values)

    def _node_params(self, n) -> tuple[str, ...]:
        import torch
        names = []
        if n.op == "call_module":
            names = [self.param_name[id(p)] for p in self.gm.get_submodule(n.target).parameters()]
        for inp in n.all_input_nodes:
            if inp.op == "get_attr":
                value = self.gm
                for part in inp.target.split("."):
                    value = getattr(value, part)
                if isinstance(value, torch.nn.Parameter):
                    names.append(self.param_name[id(value)])
        return tuple(dict.fromkeys(names))

    def _pack(self, t):
        key = t.untyped_storage()._cdata
        if key not in self.param_storages and key not in self.saved_owner:
            self.saved_owner[key] = self.current
            nbytes = float(t.untyped_storage().nbytes())
            self.saved_bytes[self.current] = self.saved_bytes.get(self.current, 0.0) + nbytes
        return t

    def cost_graph(self, name: str, unit_of, layers: int | None, cache_bytes: float | None = None) -> CostGraph:
        import torch
        common_idx: dict[str, int] = {}
        seq_idx: dict[str, int] = {}
        common, seq, units, output_inputs = [], [], [], ()
        for n in self.gm.graph.nodes:
            if n.op == "get_attr":
                continue
            if n.op == "output":
                output_inputs = tuple(seq_idx[i.name] for i in n.all_input_nodes if i.name in seq_idx)
                continue
            ins = [i for i in n.all_input_nodes if i.op != "get_attr"]
            is_common = n.op == "placeholder" or (not self.params[n.name] and all(i.name in common_idx for i in ins))
            flat = _flat_tensors(self.outputs[n.name])
            times = pass_times(self.device, self.ops[n.name], self.dtype, cache_bytes=cache_bytes)
            unit = _unit(n, unit_of)
            node = CostNode(
                name=n.name, fwd_s=times.fwd, bwd_s=0.0 if is_common else times.bwd,
                fwd_membound_s=times.fwd_membound, bwd_membound_s=0.0 if is_common else times.bwd_membound,
                output_bytes=sum(float(t.numel() * t.element_size()) for t in flat),
                activation_bytes=0.0 if is_common else self.saved_bytes.get(n.name, 0.0),
                params=self.params[n.name],
                inputs=tuple(seq_idx[i.name] for i in ins if i.name in seq_idx),
                common_inputs=tuple(common_idx[i.name] for i in ins if i.name in common_idx),
                unit=unit, is_tensor=any(isinstance(t, torch.Tensor) for t in flat), scope=_scope(n))
            if is_common:
                common_idx[n.name] = len(common)
                common.append(node)
            else:
                seq_idx[n.name] = len(seq)
                seq.append(node)
                units.append(unit)
        checkpoint: dict[int, float] = {}
        for node in seq:   # a recomputed unit keeps the tensors entering it from outside
            if node.unit < 0:
                continue
            for u in node.inputs:
                if seq[u].unit != node.unit and seq[u].is_tensor:
                    checkpoint[node.unit] = checkpoint.get(node.unit, 0.0) + seq[u].output_bytes
        return CostGraph(name=name, nodes=tuple(seq), common=tuple(common), param_numel=self.param_numel,
                         output_inputs=output_inputs, unit_checkpoint_bytes=checkpoint,
                         layers=layers, source="traced")


def _flat_tensors(x) -> list:
    import torch
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _flat_tensors(item)]
    if isinstance(x, dict):
        return [t for item in x.values() for t in _flat_tensors(item)]
    return []


def _scope(n) -> str:
    if n.op == "call_module":
        return str(n.target)
    paths = list((n.meta.get("nn_module_stack") or {}).keys())
    return paths[-1] if paths else ""


def _unit(n, unit_of) -> int:
    if unit_of is None:
        return -1
    paths = list((n.meta.get("nn_module_stack") or {}).keys())
    if n.op == "call_module":
        paths.append(n.target)
    for path in paths:
        unit = unit_of(path)
        if unit is not None:
            return unit
    return -1


def _AttentionMode(recorder: _Recorder):
    """Prices ``F.scaled_dot_product_attention`` as one fused op (see ``aten_costs``)."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    class AttentionMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is not F.scaled_dot_product_attention:
                return func(*args, **kwargs)
            q, k, v = args[:3]
            recorder.suppress = True     # its decomposition on the meta device is not what runs
            try:
                with torch.no_grad():
                    out = func(*args, **kwargs)
            finally:
                recorder.suppress = False
            grad = any(t.requires_grad for t in (q, k, v))
            out = out.detach().requires_grad_(grad)
            recorder.ops[recorder.current].append(attention_op(q, k, bool(kwargs.get("is_causal", False))))
            if grad:
                for t in (q, k, v, out):
                    recorder._pack(t)
                node = recorder.current
                recorder.saved_bytes[node] = recorder.saved_bytes.get(node, 0.0) + attention_saved_bytes(q)
            return out

    return AttentionMode()


def _DispatchRecorder(recorder: _Recorder):
    """Records the aten ops dispatched inside a node (not while ``recorder.suppress``)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class DispatchRecorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not recorder.suppress:
                op = aten_op(func, args, kwargs, out)
                if op is not None:
                    recorder.ops[recorder.current].append(op)
            return out

    return DispatchRecorder()
