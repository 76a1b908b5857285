"""Property tests (hypothesis) for every input parser: whatever the input, a parser returns a
valid object or raises SpecError -- never another exception -- and what it accepts obeys the
spec (a plan round-trips through its canonical string; a model's sizes are positive
integers). ``make fuzz`` (tests/fuzz/run.py) replays the same kinds of input through the CLI
at scale; these keep a fast sample of it in the suite."""
from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsim.specs import ModelSpec, Plan, SpecError, load_cluster, model_from_dict, model_from_hf_config, parse_plan
from parsim.specs.files import read_mapping
from parsim.specs.plan import MAX_INT
from parsim.specs.stack import STACKS

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

PLAN_KEYS = ["dp", "tp", "pp", "vpp", "mbs", "gbs", "schedule", "zero", "offload", "recompute", "sp", "dtype",
             "partition", "dp_bucket_bytes", "dp_overlap", "tp_overlap", "dp_impl", "recompute_layers", "colour"]
numbers = st.one_of(st.integers(-5, 64), st.integers(-(2 ** 70), 2 ** 70), st.just(10 ** 309),
                    st.floats(allow_nan=True, allow_infinity=True))
scalars = st.one_of(numbers, st.booleans(), st.none(), st.text(max_size=12),
                    st.sampled_from(["1f1b", "true", "four", "1.7", "inf", "nan", "2", "1,2", "balanced", ""]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                       max_size=3), max_leaves=8)
value_text = st.one_of(st.integers(-3, 2 ** 60).map(str), st.sampled_from(
    ["", "abc", "1.7", "nan", "1e400", "²", "١٢", "1,2,x", "9" * 40, "true", "none", "1f1b", "+3", " 4"]))


def _only_spec_errors(fn, *args):
    try:
        return fn(*args)
    except SpecError:
        return None


@FAST
@given(st.lists(st.tuples(st.sampled_from(PLAN_KEYS), value_text), max_size=6), st.booleans())
def test_plan_strings_parse_or_raise_spec_error_and_round_trip(pairs, with_junk):
    text = " ".join(f"{k}={v}" for k, v in pairs) + (" junk" if with_junk else "")
    plan = _only_spec_errors(parse_plan, text)
    if plan is not None:
        assert parse_plan(plan.to_string()) == plan
        assert all(1 <= getattr(plan, k) <= MAX_INT for k in ("dp", "tp", "pp", "vpp", "mbs", "gbs"))


@FAST
@given(st.dictionaries(st.sampled_from(PLAN_KEYS), values, max_size=5))
def test_plan_mappings_parse_or_raise_spec_error(data):
    plan = _only_spec_errors(parse_plan, data)
    if plan is not None:
        assert isinstance(plan, Plan) and parse_plan(plan.to_string()) == plan


MODEL = {"name": "m", "layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "vocab": 256, "seq_len": 32}


@FAST
@given(st.dictionaries(st.sampled_from(list(ModelSpec.field_names()) + ["colour"]), values, max_size=4))
def test_model_mappings_give_a_valid_model_or_a_spec_error(changes):
    model = _only_spec_errors(model_from_dict, {**MODEL, **changes})
    if model is not None:
        for name in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len"):
            v = getattr(model, name)
            assert isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 2 ** 53
        assert all(isinstance(getattr(model, b), bool) for b in ("tied_embeddings", "dropout", "bias"))
        assert 0 < model.norm_eps < 1 and math.isfinite(model.norm_eps)


HF = {"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 256}
HF_KEYS = ["num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
           "vocab_size", "max_position_embeddings", "hidden_act", "model_type", "tie_word_embeddings",
           "attention_dropout", "attention_bias", "_name_or_path", "n_layer"]


@FAST
@given(st.dictionaries(st.sampled_from(HF_KEYS), values, max_size=4))
def test_hf_configs_give_a_valid_model_or_a_spec_error(changes):
    model = _only_spec_errors(model_from_hf_config, {**HF, **changes})
    assert model is None or isinstance(model, ModelSpec)


@FAST
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode), st.sampled_from([".yaml", ".json"]))
def test_any_bytes_read_as_a_spec_file_give_a_mapping_or_a_spec_error(data, suffix):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "f" + suffix)
        path.write_bytes(data)
        out = _only_spec_errors(read_mapping, path, "model")
    assert out is None or isinstance(out, dict) and all(isinstance(k, (str, int)) for k in out)


@FAST
@given(st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.one_of(st.text(max_size=4), st.integers(), st.booleans()), inner, max_size=3), max_leaves=20))
def test_yaml_documents_of_any_shape_are_read_or_refused_with_spec_error(doc):
    try:
        text = yaml.safe_dump(doc)
    except (yaml.YAMLError, ValueError, OverflowError):
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "f.yaml")
        path.write_text(text)
        _only_spec_errors(read_mapping, path, "plan")


@FAST
@given(st.sampled_from(["a100-80g", "cpu", "h100-sxm", "nope", "", "cpu:2"]), value_text)
def test_cluster_strings_give_a_cluster_or_a_spec_error(preset, count):
    cluster = _only_spec_errors(load_cluster, f"{preset}:{count}")
    assert cluster is None or 1 <= cluster.num_devices <= 2 ** 53


@FAST
@given(st.dictionaries(st.sampled_from(["model", "plans", "steps", "warmup", "rounds", "description", "x"]), values,
                       max_size=4))
def test_matrices_load_or_raise_spec_error(data):
    from parsim.study.validate import load_matrix
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "m.yaml")
        try:
            path.write_text(json.dumps(data))          # JSON is YAML
        except ValueError:
            return
        _only_spec_errors(load_matrix, path)


cells = st.one_of(st.sampled_from(["", "0F0", "0B0", "1F0", "1B0", "0F1", "0B1", "0I0", "0W0", "0F99999999999",
                                   "(0F1;0B0)OVERLAP_F_B", "0SEND_F0", "1RECV_F0", "0UNSHARD", "x", "-1F0"]),
                  st.text(max_size=5))


@FAST
@given(st.lists(st.lists(cells, max_size=6), max_size=3), st.one_of(st.none(), st.integers(-1, 4)))
def test_schedule_csv_files_load_or_raise_spec_error(rows, pp):
    from parsim.schedules import load_schedule_csv
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "s.csv")
        path.write_text("\r\n".join(",".join(r) for r in rows))
        if pp is not None and pp < 1:
            return
        _only_spec_errors(load_schedule_csv, path, pp)


@FAST
@given(st.lists(st.tuples(st.sampled_from(PLAN_KEYS[:13]), value_text), max_size=4))
def test_sweep_fix_strings_give_a_space_or_a_spec_error(pairs):
    from parsim.study.space import build_space
    _only_spec_errors(build_space, None, " ".join(f"{k}={v}" for k, v in pairs))


@FAST
@given(st.dictionaries(st.sampled_from(["steps", "warmup", "seed", "timeout_s", "save_at"]), numbers, max_size=3))
def test_executor_options_give_a_config_or_a_spec_error(options):
    pytest.importorskip("torch")
    from parsim.executor.config import ExecutorConfig
    try:
        config = ExecutorConfig(**options)
    except SpecError:
        return
    assert 1 <= config.steps <= 2 ** 24 and math.isfinite(config.timeout_s) and config.timeout_s > 0


PROFILE_PATHS = [("device", "peak_flops", "bf16"), ("device", "memory_bytes"), ("device", "memory_bandwidth"),
                 ("device", "gemm", "max_efficiency"), ("device", "gemm", "half_dim"), ("device", "kernel_overhead_s"),
                 ("device", "usable_memory_fraction"), ("device", "host_flops"), ("devices_per_node",), ("name",),
                 ("network", "intra_node", "bandwidth"), ("network", "inter_node", "latency"),
                 ("network", "host_link"), ("network", "nics_per_node"), ("device",), ("device", "peak_flops"),
                 ("device", "default_stack"), ("device", "stacks"), ("device", "stacks", "megatron-core"),
                 ("device", "stacks", "megatron-core", "gemm_efficiency"),
                 ("device", "stacks", "fsdp2", "op_overhead_s")]


@FAST
@given(st.lists(st.tuples(st.sampled_from(PROFILE_PATHS), values), min_size=1, max_size=3))
def test_profile_mappings_give_a_cluster_of_finite_positive_numbers_or_a_spec_error(changes):
    from parsim.specs import cluster_from_dict, load_profile_dict
    data = load_profile_dict("a100-80g")
    for where, value in changes:
        node = data
        for key in where[:-1]:
            node = node.setdefault(key, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node[where[-1]] = value
    cluster = _only_spec_errors(cluster_from_dict, data, 8)
    if cluster is not None:
        dev, net = cluster.device, cluster.network
        rates = [*dev.peak_flops.values(), dev.memory_bytes, dev.memory_bandwidth, dev.host_flops,
                 dev.host_memory_bandwidth, dev.gemm.max_efficiency, dev.membound_efficiency,
                 net.intra_node.bandwidth, net.inter_node.bandwidth, net.host_link.bandwidth]
        assert all(math.isfinite(x) and x > 0 for x in rates)
        assert all(math.isfinite(x) and x >= 0 for x in (dev.kernel_overhead_s, net.intra_node.latency,
                                                         net.inter_node.latency, dev.gemm.half_dim))
        assert 0 < dev.usable_memory_fraction <= 1 and 1 <= cluster.devices_per_node <= 2 ** 53
        per_gpu = [x for stack in dev.stacks.values() for x in stack.per_gpu().values()]
        assert dev.default_stack in STACKS and all(math.isfinite(x) and x >= 0 for x in per_gpu)


@FAST
@given(st.lists(st.lists(st.one_of(value_text, st.sampled_from(['"[0.5]"', "[1]", "[]", "{", "NaN", "-1"])),
                         max_size=10), max_size=3))
def test_run_logs_read_back_or_raise_spec_error(rows):
    from parsim.study.validate import read_rounds, read_rows
    from parsim.study.validate.matrix import COLUMNS, ROUND_COLUMNS
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "rounds.csv").write_text("\n".join([",".join(ROUND_COLUMNS), *(",".join(r) for r in rows)]))
        Path(tmp, "validation.csv").write_text("\n".join([",".join(COLUMNS), *(",".join(r) for r in rows)]))
        for measured in _only_spec_errors(read_rounds, Path(tmp)) or []:
            assert math.isfinite(measured.step_time_s) and measured.step_time_s >= 0
        for row in _only_spec_errors(read_rows, Path(tmp)) or []:
            assert row["world_size"] >= 1 and all(
                row[k] is None or math.isfinite(row[k]) for k in ("measured_step_s", "predicted_step_s"))
