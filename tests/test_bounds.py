"""Bounded work (issue 23, item 2): the plan-side estimate of a simulation's events follows
the engine's own count, and plans above the limit are refused before anything runs, with a
message that says how big and what to use instead; the limit is overridable."""
from __future__ import annotations

import random

import pytest

from parsim.api import simulate
from parsim.sim.symmetry import full_mode_classes
from parsim.costs.work import gradient_buckets, simulation_work
from parsim.sim import simulate as run_engine
from parsim.specs import SpecError, load_cluster, load_model, parse_plan, validate
from parsim.specs.bounds import DEFAULT_MAX_EVENTS, check_schedule_size, check_work, estimate_work, max_events


def _random_valid_plans(n: int, seed: int = 7):
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        model = load_model(rng.choice(["tiny", "gpt3-125m", "gpt3-1.3b"]))
        devices = rng.choice([1, 2, 4, 8])
        dp = rng.choice([d for d in (1, 2, 4, 8) if devices % d == 0])
        tp = rng.choice([t for t in (1, 2) if (devices // dp) % t == 0])
        pp = devices // dp // tp
        microbatches = rng.choice([1, 2, 4, 8, 16])
        plan = parse_plan(dict(dp=dp, tp=tp, pp=pp, mbs=1, gbs=dp * microbatches, zero=rng.choice([0, 1, 3]),
                               schedule=rng.choice(["1f1b", "gpipe"])))
        cluster = load_cluster(f"a100-80g:{devices}")
        try:
            validate(model, cluster, plan)
        except SpecError:
            continue
        out.append((model, cluster, plan, rng.choice(["representative", "full"]), rng.random() < 0.3))
    return out


def test_the_estimate_follows_the_engines_event_count():
    ratios = []
    for model, cluster, plan, mode, detail in _random_valid_plans(40):
        actual = run_engine(model, cluster, plan, mode=mode, detail=detail).num_events
        # full mode simulates one device per class of identical ranks (parsim.sim.symmetry)
        replicas = len(full_mode_classes(cluster, plan, {}).simulated) // plan.pp if mode == "full" else None
        estimate = simulation_work(model, cluster, plan, mode=mode, detail=detail, replicas=replicas).events
        ratios.append(estimate / actual)
    ratios.sort()
    assert ratios[0] > 0.3                      # never far below the engine: the bound holds
    assert ratios[len(ratios) // 2] < 4         # and typically within a few times of it
    assert ratios[-1] < 40


def test_a_huge_batch_is_refused_naming_gbs_how_big_and_what_instead():
    with pytest.raises(SpecError) as err:
        simulate("gpt3-125m", "a100-80g:8", "dp=8 gbs=1000000000000")
    text = str(err.value)
    assert err.value.field == "gbs"
    assert "125,000,000,000 microbatches" in text and "GiB of trace" in text
    assert "fewer microbatches" in text and "parsim sweep" in text and "PARSIM_MAX_EVENTS" in text


def test_full_mode_suggests_representative_and_the_device_count_names_the_cluster():
    with pytest.raises(SpecError) as err:
        # stragglers split DP and TP indices into classes that full mode simulates one by one
        simulate("gpt3-125m", "a100-80g:4096", "dp=1024 tp=4 gbs=4194304", mode="full",
                 slowdown={0: 1.5, 9: 1.2, 18: 1.3, 27: 1.1})
    assert "mode=representative" in str(err.value)
    with pytest.raises(SpecError) as err:
        simulate("tiny", "cpu:1000000000000", "dp=1000000000000")
    assert err.value.field == "cluster" and "fewer devices" in str(err.value)


def test_the_limit_is_overridable_by_argument_and_environment(monkeypatch):
    model, cluster, plan = load_model("tiny"), load_cluster("cpu:2"), parse_plan("pp=2 gbs=64")
    work = estimate_work(model, cluster, plan)
    assert check_work(model, cluster, plan).events == work.events
    with pytest.raises(SpecError):
        check_work(model, cluster, plan, limit=work.events - 1)
    monkeypatch.setenv("PARSIM_MAX_EVENTS", str(work.events - 1))
    with pytest.raises(SpecError) as err:
        simulate(model, cluster, plan)
    assert "above the limit" in str(err.value)
    assert simulate(model, cluster, plan, max_events=work.events).step_time_s > 0
    monkeypatch.setenv("PARSIM_MAX_EVENTS", "lots")
    with pytest.raises(SpecError) as err:
        max_events()
    assert err.value.field == "PARSIM_MAX_EVENTS"
    monkeypatch.delenv("PARSIM_MAX_EVENTS")
    assert max_events() == DEFAULT_MAX_EVENTS


def test_gradient_buckets_of_a_huge_vocabulary_count_toward_the_bound(tmp_path):
    from parsim.specs import model_from_dict
    model = model_from_dict({"layers": 4, "hidden": 64, "heads": 4, "vocab": 10 ** 12})
    plan = parse_plan("dp=2")
    assert gradient_buckets(model, plan) > 10 ** 6 and gradient_buckets(model, parse_plan("tp=2")) == 0
    with pytest.raises(SpecError) as err:
        simulate(model, "a100-80g:2", plan)
    assert err.value.field == "model" and "gradient buckets" in str(err.value)


def test_schedules_are_bounded_by_their_action_count():
    assert check_schedule_size(4, 1, 8) == 64
    with pytest.raises(SpecError) as err:
        check_schedule_size(4, 1, 10 ** 9)
    assert err.value.field == "microbatches"


def test_a_sweep_too_big_to_enumerate_is_refused_before_it_is_built(monkeypatch):
    from parsim.api import sweep
    monkeypatch.setenv("PARSIM_MAX_SWEEP_PLANS", "100")
    with pytest.raises(SpecError) as err:
        sweep("tiny", "cpu:8", resimulate=0)
    assert err.value.field == "space" and "--fix" in str(err.value)
    monkeypatch.delenv("PARSIM_MAX_SWEEP_PLANS")
    assert sweep("tiny", "cpu:8", resimulate=0, fix="tp=1 pp=1 mbs=1").num_plans >= 1


def test_a_sweep_re_simulates_only_plans_under_the_bound():
    from parsim.api import sweep
    found = sweep("gpt3-125m", "a100-80g:8", gbs=10 ** 12, resimulate=3, fix="tp=1 pp=1 zero=0 recompute=none")
    assert found.num_plans >= 1 and found.result.num_resimulated == 0
    assert all(r["source"] == "fast" for r in found.rows())


# What the fuzzer (tests/fuzz/run.py) found unbounded, kept as regressions:

def test_a_trillion_layers_without_data_parallelism_is_refused_before_the_engine_lays_them_out():
    from parsim.specs import model_from_dict
    model = model_from_dict({"layers": 10 ** 12, "hidden": 64, "heads": 4})
    with pytest.raises(SpecError) as err:
        simulate(model, "a100-80g:1", "dp=1")
    assert err.value.field == "model.layers"


def test_a_sweep_of_a_trillion_layers_is_refused_before_the_fast_path_walks_them():
    from parsim.api import sweep
    from parsim.specs import model_from_dict
    model = model_from_dict({"layers": 10 ** 12, "hidden": 64, "heads": 4})
    with pytest.raises(SpecError) as err:
        sweep(model, "a100-80g:2", resimulate=0)
    assert err.value.field == "model.layers" and "layer by layer" in str(err.value)


def test_the_memory_of_a_trillion_layers_is_one_clear_refusal_not_a_memory_error(tmp_path, capsys):
    from parsim.cli import main
    f = tmp_path / "model.yaml"
    f.write_text("layers: 1000000000000\nhidden: 64\nheads: 4\n")
    assert main(["memory", "--json", "--model", str(f), "--cluster", "a100-80g:1", "--plan", "dp=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "model.layers=1000000000000" in err and "pipeline stages" in err
    # a large but bounded model is priced: 20,000 layers on 4 stages
    f.write_text("layers: 20000\nhidden: 64\nheads: 4\n")
    assert main(["memory", "--json", "--model", str(f), "--cluster", "a100-80g:4", "--plan", "pp=4 gbs=4"]) == 0


def test_a_long_naive_pipeline_dry_runs_in_linear_time():
    import time

    from parsim.schedules import build_schedule, dry_run
    start = time.monotonic()
    grid = dry_run(build_schedule("naive", 1703, 8, 1))
    assert time.monotonic() - start < 20          # minutes before the list scheduler woke only waiting ranks
    assert grid.makespan == 8 * (1703 * 1 + 1703 * 2)   # naive: each microbatch's F and B cross every stage alone


def test_the_partitioner_refuses_a_model_it_would_take_minutes_and_gigabytes_to_cut():
    from parsim.api import partition
    from parsim.specs import model_from_dict
    model = model_from_dict({"layers": 2000, "hidden": 64, "heads": 4})
    start = time_now()
    with pytest.raises(SpecError) as err:
        partition(model, "pp=4", "a100-80g:4", graph="analytic")
    assert err.value.field == "model.layers" and "at most 1,000 layers" in str(err.value)
    assert time_now() - start < 5


def time_now() -> float:
    import time
    return time.monotonic()


def test_zero1s_whole_tensor_partition_lists_only_the_replicas_a_tensor_reaches():
    """With more replicas than tensors each tensor goes alone to an empty one: the replica that
    owns the most holds the largest tensor, for dp = 10**9 as for dp = the tensor count, and the
    partition is not laid out over a billion replicas (a sweep's MemoryError, fuzz seed 73)."""
    from parsim.costs.params import stage_tensors, zero1_owned_params
    model = load_model("tiny")
    plan = parse_plan("dp=1000000000 gbs=1000000000 zero=1")
    tensors = stage_tensors(model, plan)[0]
    assert zero1_owned_params(model, plan) == [max(tensors)]
    assert zero1_owned_params(model, plan.replace(dp=len(tensors), gbs=len(tensors))) == [max(tensors)]
