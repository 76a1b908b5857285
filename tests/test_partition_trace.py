"""Tracing modules into cost graphs on the meta device (torch.fx; Merak's proxy nodes)."""
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from parsim.executor.model import reference_model  # noqa: E402
from parsim.partition import build_graph, load_factory, partition, resolve_source  # noqa: E402
from parsim.partition.stage_cost import state_bytes_per_param  # noqa: E402
from parsim.partition.trace import find_layers, trace_module  # noqa: E402
from parsim.specs import ModelSpec, Plan, SpecError, load_cluster, load_model  # noqa: E402

pytestmark = pytest.mark.torch
CPU = load_cluster("cpu:2")
HEAVY_HEAD = ModelSpec(name="heavy-head", layers=8, hidden=512, heads=8, ffn_hidden=2048, vocab=32000,
                       seq_len=128, dropout=False)


def test_reference_decoder_is_cut_at_layer_starts_and_counts_every_parameter_once():
    model = load_model("tiny")
    result = partition(model, "gbs=4 dtype=fp32", "cpu:1", graph="traced", reference_model=reference_model)
    assert result.graph == "traced" and result.partition == (4,)
    expected = sum(p.numel() for p in _reference(model).parameters())   # tied embedding counted once
    assert result.stages[0].state_bytes == pytest.approx(expected * state_bytes_per_param(Plan(dtype="fp32")))
    two = partition(model, "pp=2 gbs=4 dtype=fp32", "cpu:2", graph="traced", reference_model=reference_model)
    assert sum(two.partition) == 4
    assert all(b.startswith("layers_") for b in two.boundaries)
    # with pp > 1 the tied word embedding is held by the first and the last stage (Megatron-LM)
    words = model.vocab * model.hidden
    assert sum(s.state_bytes for s in two.stages) == pytest.approx(
        (expected + words) * state_bytes_per_param(Plan(dtype="fp32")))


def test_traced_and_analytic_graphs_agree_on_stage_times():
    traced = partition(HEAVY_HEAD, "pp=2 gbs=8 dtype=fp32", CPU, graph="traced", reference_model=reference_model)
    analytic = partition(HEAVY_HEAD, "pp=2 gbs=8 dtype=fp32", CPU, graph="analytic")
    assert traced.partition == analytic.partition
    for t, a in zip(traced.stages + traced.uniform_stages, analytic.stages + analytic.uniform_stages):
        assert t.time_s == pytest.approx(a.time_s, rel=0.10)


def test_tracing_allocates_no_weights_for_a_13b_model():
    graph = build_graph(resolve_source(load_model("gpt3-13b").__class__(
        name="13b-4layers", layers=4, hidden=5120, heads=40, seq_len=2048)), Plan(), load_cluster("a100-80g:1"),
        "traced", reference_model)
    # 4 layers of 13B: 1.26e9 parameters, 5 GB in fp32, traced without allocating them
    assert sum(graph.param_numel.values()) > 1.2e9
    assert len(graph.nodes) > 50


def test_mixed_width_factory_partition_beats_the_uniform_split():
    result = partition("studies.merak.models:mixed_width", "pp=4 gbs=16 dtype=fp32", "cpu:4")
    assert result.layered and sum(result.partition) == 8
    assert result.speedup_vs_uniform > 1.3
    assert max(s.time_s for s in result.stages) < max(s.time_s for s in result.uniform_stages)


def test_inputs_only_nodes_are_common_to_every_stage():
    module, inputs = load_factory("studies.merak.models:mixed_width")
    graph = trace_module(module, inputs, name="mixed", cluster=CPU, dtype="fp32")
    common = {n.name for n in graph.common}
    assert {"tokens", "attention_mask", "causal_padding_bias", "arange"} <= common
    assert not any(n.name == "causal_padding_bias" for n in graph.nodes)
    # every block uses the mask: it never counts as a tensor crossing a cut
    count, _ = graph.live_at_cuts()
    starts = [c for c in range(1, len(graph.nodes)) if graph.nodes[c].unit >= 1
              and graph.nodes[c].unit != graph.nodes[c - 1].unit]
    assert all(count[c] == 1 for c in starts)


class Branchy(nn.Module):
    """Python control flow on tensor values: not symbolically traceable on its own."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(32, 32), nn.Linear(32, 32)

    def forward(self, x):
        if x.sum() > 0:   # data-dependent
            return self.a(x)
        return self.b(x)


class WithBranchyLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(32, 32), Branchy(), nn.Linear(32, 32), nn.Linear(32, 32)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def test_untraceable_submodule_becomes_one_leaf_node():
    graph = trace_module(WithBranchyLayer(), torch.zeros(16, 32), name="branchy", cluster=CPU, dtype="fp32")
    leaf = [n for n in graph.nodes if n.name == "layers_1"]
    assert len(leaf) == 1 and set(leaf[0].params) == {"layers.1.a.weight", "layers.1.a.bias", "layers.1.b.weight",
                                                       "layers.1.b.bias"}
    assert leaf[0].fwd_s > 0


class TiedEnds(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(4))
        self.shared = nn.Parameter(torch.empty(64, 64))

    def forward(self, x):
        x = x @ self.shared
        for layer in self.layers:
            x = layer(x)
        return x @ self.shared.t()


def test_a_weight_used_by_two_stages_is_held_by_both():
    result = partition(lambda: (TiedEnds(), torch.zeros(8, 64)), "pp=2 gbs=4 dtype=fp32", CPU)
    per_param = state_bytes_per_param(Plan(dtype="fp32"))
    shared = 64 * 64 * per_param
    assert all(s.state_bytes >= shared for s in result.stages)
    total = sum(p.numel() for p in TiedEnds().parameters()) * per_param
    assert sum(s.state_bytes for s in result.stages) == pytest.approx(total + shared)


def test_find_layers_picks_the_largest_repeated_container():
    module, _ = load_factory("studies.merak.models:mixed_width")
    assert find_layers(module) == ("blocks", 8)


def test_bad_factories_name_the_model_field():
    for ref in ("studies.merak.models:nope", "no_such_pkg.mod:factory", "studies/merak/nofile.py:f", lambda: 42):
        with pytest.raises(SpecError) as err:
            partition(ref, "pp=2 gbs=4 dtype=fp32", CPU)
        assert err.value.field == "model"
    with pytest.raises(SpecError) as err:
        partition("studies.merak.models:mixed_width", "pp=2 gbs=4", CPU, graph="analytic")
    assert err.value.field == "graph"


def test_a_model_spec_is_traced_only_as_the_reference_model_its_caller_passes():
    with pytest.raises(SpecError) as err:
        partition(HEAVY_HEAD, "pp=2 gbs=8 dtype=fp32", CPU, graph="traced")
    assert err.value.field == "graph" and "reference_model" in err.value.allowed
    assert partition(HEAVY_HEAD, "pp=2 gbs=8 dtype=fp32", CPU).graph == "analytic"
    assert partition(HEAVY_HEAD, "pp=2 gbs=8 dtype=fp32", CPU, reference_model=reference_model).graph == "traced"


def _reference(model):
    with torch.device("meta"):
        return reference_model(model)[0]


def test_a_traced_dropout_is_priced_as_the_calibrations_dropout():
    """On meta (as on a CPU) ``F.dropout`` draws ``bernoulli_`` into an empty tensor: that draw
    stands for the calibration's "dropout" benchmark, read + write of the noise as its bytes."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from parsim.partition.aten_costs import aten_op
    ops = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            ops.append(aten_op(func, args, kwargs, out))
            return out

    x = torch.randn(4, 8, device="meta", requires_grad=True)
    with Record():
        torch.nn.functional.dropout(x, 0.1, True)
    [draw] = [op for op in ops if op is not None and op.name == "dropout"]
    assert draw.kind == "membound" and draw.fwd_bytes == 2 * x.numel() * x.element_size()
