"""The partitioner's answer runs on the torch executor and trains the same model."""
import pytest

pytest.importorskip("torch")

from parsim.partition import partition  # noqa: E402
from parsim.specs import ModelSpec, Plan  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.torch]

# 6 small layers and a large vocabulary: the output layer outweighs a layer, so the split is uneven
MODEL = ModelSpec(name="heavy-head-small", layers=6, hidden=64, heads=4, ffn_hidden=256, vocab=8192, seq_len=32,
                  dropout=False)


def test_auto_partition_executes_and_matches_the_uniform_split_losses():
    from parsim.executor import ExecutorConfig, RunSpec, run_plans
    from parsim.executor.model import reference_model

    plan = Plan(pp=2, gbs=4, dtype="fp32")
    result = partition(MODEL, plan, "cpu:2", graph="traced", reference_model=reference_model)
    assert result.partition != result.uniform_partition
    config = ExecutorConfig(steps=3, warmup=1)
    uniform, auto = run_plans([RunSpec(MODEL, plan.replace(partition=result.uniform_partition), config),
                               RunSpec(MODEL, plan.replace(partition=result.partition), config)])
    # where the stages are cut does not change the arithmetic (fp32, same weights and data)
    assert auto.losses == pytest.approx(uniform.losses, rel=1e-5)
    stages = {e.stage for e in auto.trace.action_events()}
    assert stages == {0, 1}
