"""Sweep enumeration: the vectorised rules accept exactly the plans ``validate`` accepts."""
import itertools

import numpy as np
import pytest

from parsim.fast import PlanTable, product_table, valid_mask
from parsim.specs import OFFLOADS, RECOMPUTES, SCHEDULES, SpecError, load_cluster, load_model, validate
from parsim.study.enumerate import candidate_plans, degree_triples, enumerate_plans, space_values
from parsim.study.space import SweepSpace, build_space, load_space_file, parse_fix

SMALL = dict(vpp=(1, 2, 3), mbs=(1, 2, 4), gbs=(8, 12, 16), schedule=SCHEDULES, zero=(0, 1, 2, 3),
             offload=OFFLOADS, recompute=RECOMPUTES, sp=(False, True), dtype=("bf16", "fp32"),
             dp_impl=("allreduce", "ps"))


def _accepted_by_validate(model, cluster, plan) -> bool:
    try:
        validate(model, cluster, plan)
        return True
    except SpecError:
        return False


@pytest.mark.parametrize("model_name, cluster_name", [("tiny", "cpu:8"), ("llama3-8b", "a100-80g:16"),
                                                      ("gpt3-125m", "a100-80g:12")])
def test_vectorised_rules_accept_exactly_the_plans_validate_accepts(model_name, cluster_name):
    model, cluster = load_model(model_name), load_cluster(cluster_name)
    divs = [d for d in range(1, 17)]
    # the raw product, including dp*tp*pp != devices, so every rule gets exercised
    narrow = {**SMALL, "mbs": (1, 2), "gbs": (8, 12), "dtype": ("bf16",), "recompute": ("none", "full")}
    table = product_table(dict(dp=divs[:8], tp=(1, 2, 3, 4, 8, 16), pp=(1, 2, 3, 4, 8), **narrow))
    rng = np.random.default_rng(7)
    # half the sample anywhere, half on the device count, so every rule accepts and rejects
    on_count = np.flatnonzero(table["dp"] * table["tp"] * table["pp"] == cluster.num_devices)
    rows = np.concatenate([rng.choice(len(table), size=3000, replace=False),
                           rng.choice(on_count, size=min(len(on_count), 3000), replace=False)])
    sample = table.take(rows)
    mask = valid_mask(model, cluster, sample)
    expected = np.array([_accepted_by_validate(model, cluster, plan) for plan in sample.plans()])
    assert expected.sum() > 100
    assert (mask == expected).all()


def _first_broken_rule(model, cluster, plan) -> str | None:
    try:
        validate(model, cluster, plan)
        return None
    except SpecError as err:
        return f"{err.field}: {err.allowed}"


@pytest.mark.parametrize("model_name, cluster_name", [("llama3-70b", "h100-sxm:64"), ("gpt3-175b", "a100-80g:1024")])
def test_validate_and_the_vectorised_mask_agree_on_every_plan_of_a_full_sweep_space(model_name, cluster_name):
    """Every candidate the sweep's enumeration masks (the default space: 53,760 and 126,720
    plans), one ``validate`` call each against ``valid_mask`` on the whole table."""
    model, cluster = load_model(model_name), load_cluster(cluster_name)
    table = candidate_plans(model, cluster, SweepSpace())
    assert len(table) > 50_000
    broken = [_first_broken_rule(model, cluster, plan) for plan in table.plans()]
    expected = np.array([b is None for b in broken])
    assert (valid_mask(model, cluster, table) == expected).all()
    assert 0.05 < expected.mean() < 0.95
    # the space exercises many rules, each rejecting some plans first
    assert len({b.split(":")[0] for b in broken if b}) >= 4


def test_enumeration_returns_every_valid_plan_of_the_space_and_nothing_else():
    model, cluster = load_model("tiny"), load_cluster("cpu:8")
    space = SweepSpace(**{**SMALL, "mbs": (1, 2), "dtype": ("bf16",), "dp_impl": ("allreduce",),
                          "recompute": ("none", "full")})
    got = set(enumerate_plans(model, cluster, space, canonical=False).plan_strings())
    raw = product_table(space_values(cluster, space))
    raw = raw.take(np.flatnonzero(raw["dp"] * raw["tp"] * raw["pp"] == cluster.num_devices))  # rule 1 tested above
    want = {plan.to_string() for plan in raw.plans() if _accepted_by_validate(model, cluster, plan)}
    assert got == want
    assert len(got) > 1000


def test_plan_strings_equal_plan_to_string_and_parse_back():
    from parsim.specs import parse_plan
    model, cluster = load_model("tiny"), load_cluster("cpu:8")
    t = enumerate_plans(model, cluster, SweepSpace(**SMALL, dp_bucket_bytes=1024, dp_overlap=False))
    strings = t.plan_strings()
    for i in range(0, len(t), 97):
        assert strings[i] == t.plan(i).to_string()
        assert parse_plan(strings[i]) == t.plan(i)
    assert list(t.plans())[::97] == [t.plan(i) for i in range(0, len(t), 97)]     # the bulk form, row for row


def test_degrees_multiply_to_the_device_count():
    for dp, tp, pp in degree_triples(48, SweepSpace()):
        assert dp * tp * pp == 48
    assert len(degree_triples(48, SweepSpace())) == 45      # ordered factorisations: C(6,2) for 2^4 times 3 for 3^1


def test_fix_narrows_the_space():
    model, cluster = load_model("gpt3-1.3b"), load_cluster("a100-80g:16")
    t = enumerate_plans(model, cluster, build_space(fix="tp=2 zero=1 mbs=1,2", gbs=64))
    assert set(t["tp"].tolist()) == {2} and set(t["zero"].tolist()) == {1}
    assert set(t["mbs"].tolist()) == {1, 2} and set(t["gbs"].tolist()) == {64}


def test_space_file_sets_lists_and_fix_wins(tmp_path):
    f = tmp_path / "space.yaml"
    f.write_text("schedule: [1f1b, gpipe]\nzero: [0, 1]\ndtype: fp16\n")
    space = build_space(space_file=f, fix="zero=1")
    assert space.schedule == ("1f1b", "gpipe") and space.zero == (1,) and space.dtype == ("fp16",)


@pytest.mark.parametrize("text, field", [("tp=x", "tp"), ("zero=4", "zero"), ("schedule=zigzag", "schedule"),
                                         ("sp=maybe", "sp"), ("partition=1,2", "partition"), ("tp", "fix"),
                                         ("dp_overlap=true,false", "dp_overlap"), ("mbs=0", "mbs")])
def test_bad_fix_names_the_field(text, field):
    with pytest.raises(SpecError) as e:
        parse_fix(text)
    assert e.value.field == field


def test_bad_space_file_names_the_field(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("- 1\n- 2\n")
    with pytest.raises(SpecError) as e:
        load_space_file(f)
    assert e.value.field == "space"
    with pytest.raises(SpecError) as e:
        load_space_file(tmp_path / "missing.yaml")
    assert e.value.field == "space"


def test_gbs_flag_conflicting_with_fix_is_an_error():
    with pytest.raises(SpecError) as e:
        build_space(fix="gbs=32", gbs=64)
    assert e.value.field == "gbs"


def test_table_refuses_plans_the_fast_path_does_not_model():
    from parsim.specs import Plan
    with pytest.raises(SpecError) as e:
        PlanTable.from_plans([Plan(pp=2, partition=(1, 3))])
    assert e.value.field == "partition"


def test_canonical_enumeration_drops_only_choices_that_change_nothing():
    model, cluster = load_model("tiny"), load_cluster("cpu:4")
    space = SweepSpace(gbs=(8,))
    every = enumerate_plans(model, cluster, space, canonical=False)
    canon = enumerate_plans(model, cluster, space)
    assert 0 < len(canon) < len(every)
    one_stage = canon["pp"] == 1
    assert set(canon["schedule"][one_stage].tolist()) == {SCHEDULES.index("1f1b")}
    one_replica = canon["dp"] == 1
    pairs = set(zip(canon["zero"][one_replica].tolist(), canon["offload"][one_replica].tolist()))
    assert pairs == {(0, 0), (1, OFFLOADS.index("optimizer")), (3, OFFLOADS.index("optimizer+params"))}
