"""``evaluate``: step time, throughput, MFU and peak memory of a whole PlanTable at once."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from parsim.costs import device_capacity, hardware_flops_per_step, memory_by_stage, model_flops_per_step
from parsim.specs import RECOMPUTES, ClusterSpec, ModelSpec, Plan, validate

from . import codes as K
from .kernel import PlanColumns, evaluate_all
from .plans import WORDS, PlanTable, valid_mask
from .tables import CostTables, build_tables, key_ids, with_stack
from .timing import DPSync


@dataclass
class FastResult:
    """Per-plan metrics, one array entry per row of the PlanTable (SI units)."""

    step_time_s: np.ndarray
    pipeline_time_s: np.ndarray
    tokens_per_s: np.ndarray
    mfu: np.ndarray
    hfu: np.ndarray
    bubble_fraction: np.ndarray
    exposed_tp_s: np.ndarray
    exposed_dp_s: np.ndarray
    exposed_pp_s: np.ndarray
    peak_memory_bytes: np.ndarray
    peak_stage: np.ndarray
    peak_params_bytes: np.ndarray
    peak_grads_bytes: np.ndarray
    peak_optimizer_bytes: np.ndarray
    peak_activations_bytes: np.ndarray
    peak_other_bytes: np.ndarray
    capacity_bytes: float

    def fits(self, headroom: float = 0.0) -> np.ndarray:
        """Peak memory within (1 - headroom) of the device capacity."""
        return self.peak_memory_bytes <= self.capacity_bytes * (1.0 - headroom)

    def columns(self) -> dict[str, np.ndarray]:
        return {k: v for k, v in self.__dict__.items() if isinstance(v, np.ndarray)}


def evaluate(model: ModelSpec, cluster: ClusterSpec, plans: PlanTable,
             tables: CostTables | None = None) -> FastResult:
    _check_valid(model, cluster, plans)
    model, cluster, plans = with_stack(model, cluster, plans)     # the table's software stack (``costs.stack``)
    tables = tables or build_tables(model, cluster, plans)
    c = plans.cols
    n = len(plans)
    out = np.zeros((n, K.O_WIDTH))
    if n:
        evaluate_all(out, PlanColumns.of(plans), tables, DPSync(float(plans.dp_bucket_bytes), bool(plans.dp_overlap)))
        _fsdp2_memory(out, model, cluster, plans)
    step = out[:, K.O_STEP]
    tokens = c["gbs"] * model.seq_len
    peak_flops = np.array([cluster.device.flops(d) if d in cluster.device.peak_flops else np.nan
                           for d in WORDS["dtype"]])[c["dtype"]]
    mf, hf = _flops(model, plans)
    with np.errstate(divide="ignore", invalid="ignore"):
        denom = step * cluster.num_devices * peak_flops
        return FastResult(
            step_time_s=step, pipeline_time_s=out[:, K.O_PIPE], tokens_per_s=tokens / step,
            mfu=mf / denom, hfu=hf / denom, bubble_fraction=out[:, K.O_BUBBLE],
            exposed_tp_s=out[:, K.O_TP], exposed_dp_s=out[:, K.O_DP], exposed_pp_s=out[:, K.O_PP],
            peak_memory_bytes=out[:, K.O_PEAK], peak_stage=out[:, K.O_PEAK_STAGE].astype(np.int64),
            peak_params_bytes=out[:, K.O_PARAMS], peak_grads_bytes=out[:, K.O_GRADS],
            peak_optimizer_bytes=out[:, K.O_OPT], peak_activations_bytes=out[:, K.O_ACT],
            peak_other_bytes=out[:, K.O_OTHER], capacity_bytes=device_capacity(cluster))


def _fsdp2_memory(out: np.ndarray, model: ModelSpec, cluster: ClusterSpec, plans: PlanTable) -> None:
    """Peak memory of the plans whose ZeRO-2/3 runs as FSDP2 (``tables.fsdp2_copies``: the
    calibrated profiles of the executor) by ``costs.memory_by_stage`` itself: FSDP2's buffers
    (``costs.memory.fsdp2_bytes``, its root unit by the running virtual stage) are not in the
    kernel, which read these plans 4-19 % low. About 0.5 ms a plan; the GPU stacks have none."""
    if not cluster.device.tables.fsdp2_copies:
        return
    c = plans.cols
    for i in np.flatnonzero((c["zero"] >= 2) & (c["dp"] > 1)):
        stages = memory_by_stage(model, plans.plan(int(i)), cluster)
        peak = max(stages, key=lambda st: st.total)      # the first stage of the largest, as the kernel
        out[i, K.O_PEAK], out[i, K.O_PEAK_STAGE] = peak.total, peak.stage
        out[i, K.O_PARAMS], out[i, K.O_GRADS], out[i, K.O_OPT] = peak.params, peak.grads, peak.optimizer
        out[i, K.O_ACT], out[i, K.O_OTHER] = peak.activations, peak.other


def _check_valid(model: ModelSpec, cluster: ClusterSpec, plans: PlanTable) -> None:
    """Every plan must pass ``validate``; the first one that does not raises its SpecError."""
    bad = np.flatnonzero(~valid_mask(model, cluster, plans))
    if len(bad):
        validate(model, cluster, plans.plan(int(bad[0])))
        raise AssertionError("valid_mask and validate disagree")   # unreachable: one rule table, tests hold them equal


def _flops(model: ModelSpec, plans: PlanTable) -> tuple[np.ndarray, np.ndarray]:
    """Model FLOPs (MFU numerator) and hardware FLOPs (HFU) per step, per distinct (gbs, recompute)."""
    c = plans.cols
    keys, inv = key_ids(c["gbs"], c["recompute"])
    mf = np.array([model_flops_per_step(model, int(g)) for g, _ in keys.tolist()])
    hf = np.array([hardware_flops_per_step(model, Plan(gbs=int(g), recompute=RECOMPUTES[r])) for g, r in keys.tolist()])
    return mf[inv], hf[inv]


def compile_kernels() -> None:
    """Compile the fast path's kernel (``evaluate_all`` and every rule it calls) and keep it in
    numba's on-disk cache (``jit_cache``), by evaluating one valid plan of the tiny model.
    A fresh checkout otherwise pays the compilation, about 25 s of one core, in its first
    sweep; ``tests/conftest.py`` runs this beside the test workers so that they find it cached."""
    from parsim.specs import load_cluster, load_model
    from .plans import product_table
    model, cluster = load_model("tiny"), load_cluster("cpu:8")
    table = product_table(dict(dp=(2,), tp=(2,), pp=(2,), vpp=(1,), mbs=(1,), gbs=(8,), schedule=("1f1b",), zero=(0,),
                               offload=("none",), recompute=("none",), sp=(False,), dtype=("fp32",),
                               dp_impl=("allreduce",)))
    evaluate(model, cluster, table)
