"""Specs: presets, parsing (k=v, YAML, HF config.json), rank layout."""
import json

import pytest

from parsim.specs import (MODEL_PRESETS, Plan, RankLayout, SpecError, load_cluster, load_model, parse_plan,
                          stage_layers)

REQUIRED_PRESETS = ["tiny", "gpt3-125m", "gpt3-175b", "megatron-1.7b", "megatron-3.6b", "megatron-7.5b",
                    "megatron-18.4b", "megatron-39.1b", "megatron-76.1b", "megatron-145.6b", "megatron-310.1b",
                    "megatron-529.6b", "megatron-1t", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b",
                    "llama3-70b", "llama3-405b"]


@pytest.mark.parametrize("name", REQUIRED_PRESETS)
def test_every_required_model_preset_exists(name):
    assert load_model(name).name == name


def test_megatron_presets_match_table1_shapes():
    import csv
    from pathlib import Path
    table = Path(__file__).resolve().parents[2] / "shared/validation/megatron2021_table1.csv"
    if not table.exists():
        pytest.skip(f"{table} not beside this checkout")
    with table.open() as f:
        rows = list(csv.DictReader(f))
    names = ["megatron-1.7b", "megatron-3.6b", "megatron-7.5b", "megatron-18.4b", "megatron-39.1b",
             "megatron-76.1b", "megatron-145.6b", "megatron-310.1b", "megatron-529.6b", "megatron-1t"]
    for row, name in zip(rows, names):
        m = MODEL_PRESETS[name]
        assert (m.layers, m.hidden, m.heads, m.seq_len, m.vocab) == (
            int(row["layers"]), int(row["hidden"]), int(row["heads"]), int(row["seq_len"]), int(row["vocab"]))


def test_llama3_70b_uses_gqa_and_swiglu():
    m = load_model("llama3-70b")
    assert (m.kv_heads, m.ffn_hidden, m.activation, m.tied_embeddings) == (8, 28672, "swiglu", False)


def test_plan_string_parses_every_design_key():
    p = parse_plan("dp=8 tp=8 pp=16 vpp=2 mbs=1 gbs=1536 schedule=interleaved zero=1 "
                   "recompute=selective sp=true dtype=bf16 partition=6,6,6,6")
    assert (p.dp, p.tp, p.pp, p.vpp, p.mbs, p.gbs, p.schedule, p.zero) == (8, 8, 16, 2, 1, 1536, "interleaved", 1)
    assert p.sp is True and p.recompute == "selective" and p.partition == (6, 6, 6, 6)
    assert p.num_microbatches == 1536 // 8


def test_plan_defaults_follow_design_table():
    p = parse_plan("dp=4")
    assert (p.tp, p.pp, p.vpp, p.mbs, p.gbs, p.schedule, p.zero, p.offload, p.recompute, p.sp, p.dtype,
            p.partition) == (1, 1, 1, 1, 4, "1f1b", 0, "none", "none", False, "bf16", None)


def test_plan_to_string_round_trips():
    p = parse_plan("dp=2 tp=2 pp=2 gbs=16 zero=2 sp=true partition=3,5")
    assert parse_plan(p.to_string()) == p


def test_plan_yaml_uses_the_same_keys(tmp_path):
    f = tmp_path / "plan.yaml"
    f.write_text("dp: 2\ntp: 4\nsp: true\npartition: [5, 7]\n")
    p = parse_plan(str(f))
    assert (p.dp, p.tp, p.sp, p.partition) == (2, 4, True, (5, 7))


@pytest.mark.parametrize("text, field", [
    ("dp=x", "dp"), ("zero=4", "zero"), ("schedule=zigzag", "schedule"), ("sp=maybe", "sp"),
    ("dtype=fp8", "dtype"), ("offload=disk", "offload"), ("recompute=half", "recompute"),
    ("partition=1,a", "partition"), ("colour=red", "colour"), ("dp", "plan"), ("mbs=0", "mbs"),
])
def test_bad_plan_values_name_the_field(text, field):
    with pytest.raises(SpecError) as e:
        parse_plan(text)
    assert e.value.field == field


def test_model_yaml_rejects_unknown_keys(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("layers: 2\nhidden: 64\nheads: 4\nwidth: 3\n")
    with pytest.raises(SpecError, match="model.width"):
        load_model(str(f))


def test_model_yaml_loads_with_field_names(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("name: mine\nlayers: 2\nhidden: 64\nheads: 4\nkv_heads: 2\nactivation: swiglu\n")
    m = load_model(str(f))
    assert (m.name, m.kv_heads, m.activation, m.ffn_hidden) == ("mine", 2, "swiglu", 256)


def test_hf_llama_config_maps_to_modelspec(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
           "max_position_embeddings": 8192, "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 5e5,
           "tie_word_embeddings": False}
    d = tmp_path / "llama3"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    m = load_model(str(d / "config.json"))
    ref = load_model("llama3-8b")
    for f in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len", "activation", "norm",
              "position", "tied_embeddings"):
        assert getattr(m, f) == getattr(ref, f), f


def test_cluster_preset_string_sets_device_count():
    c = load_cluster("a100-80g:1024")
    assert c.num_devices == 1024 and c.devices_per_node == 8 and c.num_nodes == 128
    assert c.device.peak_flops["bf16"] == pytest.approx(312e12)


@pytest.mark.parametrize("text", ["a100-80g", "a100-80g:zero", "nope:8", "a100-80g:0"])
def test_bad_cluster_strings_are_rejected(text):
    with pytest.raises(SpecError):
        load_cluster(text)


def test_profile_overrides_device_numbers_but_keeps_device_count():
    c = load_cluster("a100-80g:16", profile="h100-sxm")
    assert c.num_devices == 16 and c.device.peak_flops["bf16"] == pytest.approx(989e12, rel=0.01)


def test_balanced_partition_gives_remainder_to_middle_stages():
    m = load_model("gpt3-125m")   # 12 layers
    assert stage_layers(m, Plan(pp=5)) == [2, 3, 3, 2, 2]
    assert stage_layers(m, Plan(pp=4)) == [3, 3, 3, 3]


# LiBai's published grouping (LiBai docs, "Distributed Configuration"): 8 devices.
def test_rank_layout_dp2_tp4_gives_libai_tp_groups():
    lay = RankLayout(dp=2, tp=4, pp=1)
    assert lay.tp_groups() == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_rank_layout_dp2_tp2_pp2_matches_libai():
    lay = RankLayout(dp=2, tp=2, pp=2)
    assert lay.stage_ranks(0) == [0, 1, 2, 3]
    stage0_dp = [g for g in lay.dp_groups() if set(g) <= {0, 1, 2, 3}]
    stage0_tp = [g for g in lay.tp_groups() if set(g) <= {0, 1, 2, 3}]
    assert sorted(stage0_dp) == [[0, 2], [1, 3]]
    assert sorted(stage0_tp) == [[0, 1], [2, 3]]


def test_rank_layout_coords_invert_rank():
    lay = RankLayout(dp=3, tp=2, pp=4)
    for r in range(lay.world_size):
        assert lay.rank(*lay.coords(r)) == r
