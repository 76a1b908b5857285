"""Stage-aware recomputation policy (Merak, Lai et al. 2023, Sec. 5.2)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsim.costs import memory_by_stage
from parsim.costs.stage_aware import stage_aware_recompute_layers
from parsim.specs import ModelSpec, Plan, SpecError, load_cluster

# GPT-3 1.3B's layers (Brown et al. 2020) with a tiny vocabulary: every stage costs the same
# but for its place in the pipeline, so only the in-flight microbatches tell stages apart.
MODEL = ModelSpec(name="uniform-1.3b", layers=24, hidden=2048, heads=16, vocab=128, seq_len=2048)
CLUSTER = load_cluster("a100-80g:4")


def _totals(plan: Plan, layers: tuple[int, ...]) -> list[float]:
    p = plan.replace(recompute="stage-aware", recompute_layers=layers)
    return [s.total for s in memory_by_stage(MODEL, p, CLUSTER)]


def _budget_between(plan: Plan, fraction: float) -> float:
    """A budget between the largest rank memory with full and with no recomputation."""
    full = max(s.total for s in memory_by_stage(MODEL, plan.replace(recompute="full"), CLUSTER))
    none = max(s.total for s in memory_by_stage(MODEL, plan.replace(recompute="none"), CLUSTER))
    return full + fraction * (none - full)


PLAN = Plan(pp=4, mbs=4, gbs=64, dtype="bf16")


def test_earlier_stages_recompute_at_least_as_many_layers_under_1f1b():
    layers = stage_aware_recompute_layers(MODEL, PLAN, CLUSTER, _budget_between(PLAN, 0.5))
    assert len(layers) == 4
    assert list(layers) == sorted(layers, reverse=True)
    assert layers[0] > layers[-1]          # the budget is chosen so the first stage must recompute some
    assert 0 < layers[0] < 6               # ... but not all of its 6 layers


def test_policy_fits_and_one_fewer_recomputed_layer_on_any_stage_does_not():
    budget = _budget_between(PLAN, 0.4)
    layers = stage_aware_recompute_layers(MODEL, PLAN, CLUSTER, budget)
    assert all(t <= budget for t in _totals(PLAN, layers))
    for s, r in enumerate(layers):
        if r == 0:
            continue
        fewer = tuple(x - (i == s) for i, x in enumerate(layers))
        assert _totals(PLAN, fewer)[s] > budget


@settings(max_examples=25, deadline=None)
@given(fraction=st.floats(0.0, 1.2), pp=st.sampled_from([2, 3, 4, 6]), mbs=st.sampled_from([1, 2, 4]))
def test_policy_is_minimal_and_monotone_for_any_budget(fraction, pp, mbs):
    plan = Plan(pp=pp, mbs=mbs, gbs=mbs * 4 * pp, dtype="bf16")
    budget = _budget_between(plan, fraction)
    layers = stage_aware_recompute_layers(MODEL, plan, CLUSTER, budget)
    totals = _totals(plan, layers)
    assert all(t <= budget for t in totals)
    assert list(layers) == sorted(layers, reverse=True)
    for s, r in enumerate(layers):
        if r:
            fewer = tuple(x - (i == s) for i, x in enumerate(layers))
            assert _totals(plan, fewer)[s] > budget


def test_device_capacity_is_the_default_budget_and_a_small_model_recomputes_nothing():
    assert stage_aware_recompute_layers(MODEL, PLAN, CLUSTER) == (0, 0, 0, 0)


def test_interleaved_stages_fill_the_earliest_chunk_of_a_rank_first():
    plan = Plan(pp=2, vpp=2, mbs=4, gbs=32, schedule="interleaved", dtype="bf16")
    full = memory_by_stage(MODEL, plan.replace(recompute="full"), CLUSTER)[0].total
    none = memory_by_stage(MODEL, plan.replace(recompute="none"), CLUSTER)[0].total
    budget = full + 0.3 * (none - full)
    layers = stage_aware_recompute_layers(MODEL, plan, CLUSTER, budget)
    p = plan.replace(recompute="stage-aware", recompute_layers=layers)
    assert all(s.total <= budget for s in memory_by_stage(MODEL, p, CLUSTER))
    # rank 0 holds stages 0 and 2: stage 2 only recomputes once stage 0 recomputes all 6 layers
    assert layers[2] == 0 or layers[0] == 6


def test_raises_naming_recompute_when_even_full_recomputation_does_not_fit():
    full = memory_by_stage(MODEL, PLAN.replace(recompute="full"), CLUSTER)[0].total
    with pytest.raises(SpecError) as err:
        stage_aware_recompute_layers(MODEL, PLAN, CLUSTER, 0.99 * full)
    assert err.value.field == "recompute"


def test_shifted_critical_path_last_rank_never_recomputes():
    plan = PLAN.replace(shifted_critical_path=True)
    last_kept = memory_by_stage(MODEL, plan.replace(recompute="none"), CLUSTER)[-1].total
    budget = max(_budget_between(plan, 0.2), last_kept)
    layers = stage_aware_recompute_layers(MODEL, plan, CLUSTER, budget)
    assert layers[-1] == 0 and layers[0] > 0
    p = plan.replace(recompute="stage-aware", recompute_layers=layers)
    assert all(s.total <= budget for s in memory_by_stage(MODEL, p, CLUSTER))


def test_non_positive_budget_is_rejected():
    with pytest.raises(SpecError) as err:
        stage_aware_recompute_layers(MODEL, PLAN, CLUSTER, 0)
    assert err.value.field == "memory_budget"


def test_fewest_recomputed_is_the_least_count_that_fits_and_none_when_even_all_do_not():
    """The one bisection the analytic model and the partitioner share (costs.fewest_recomputed)."""
    from parsim.costs import fewest_recomputed

    calls = []

    def bytes_with(k):
        calls.append(k)
        return 100.0 - 7.0 * k - (5.0 if k >= 6 else 0.0)    # never grows with k, uneven steps

    for budget in range(20, 105):
        calls.clear()
        fitting = [k for k in range(11) if bytes_with(k) <= budget]
        calls.clear()
        got = fewest_recomputed(10, bytes_with, float(budget))
        assert got == (min(fitting) if fitting else None)
        assert len(calls) <= 1 + 4                       # the check of k = 10, then log2(11) steps
