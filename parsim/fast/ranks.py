"""The fast path's rows per pipeline rank, priced by ``parsim.costs`` once per distinct key.

* rank key (dp, tp, pp, vpp, dtype, zero, offload): per pipeline rank its layers
  (``specs.stage_layers``, loop placement) in all and per model chunk, its parameters
  (``costs.stage_params``), its DP communication (``fast.comm.rank_comm_rows``), its optimizer
  step and ZeRO-Offload's host transfers (``costs.optimizer``: the same ``OptimizerStep`` the
  SimPy engine plays at the end of the step);
* send key (dp, tp, pp, mbs, dtype): per pipeline rank r the seconds of its send to rank r + 1
  (``costs.timing.p2p_time`` of ``costs.p2p_bytes`` between the two ranks' devices).
"""
from __future__ import annotations

import numpy as np

from parsim.costs import dp_buckets, optimizer_step, p2p_bytes, stage_params, state_bytes
from parsim.costs.optimizer import bucket_to_host, layer_from_host_s
from parsim.costs.timing import p2p_time
from parsim.specs import ClusterSpec, ModelSpec, Plan, RankLayout, stage_layers

from .comm import C_WIDTH, CollectivePricer, rank_comm_rows
from .plans import WORDS

# rank table columns: layers, parameters, the optimizer step and ZeRO-Offload's transfers
# (seconds: ``costs.OptimizerStep``'s step, gradient shard down, parameter shard up; a reduced
# bucket's shard down and all the buckets'; ZeRO-Infinity's layer shard up), the fast.comm
# columns, then layers per model chunk
(R_LAYERS, R_PARAMS, R_OPT_STEP, R_GRADS_DOWN, R_PARAMS_UP, R_BUCKET_DOWN, R_BUCKETS_DOWN, R_LAYER_UP,
 R_COMM) = range(9)
R_CHUNK = R_COMM + C_WIDTH


def rank_plan(dp: int, tp: int, pp: int, vpp: int, dtype: int, zero: int = 0, offload: int = 0) -> Plan:
    return Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, dtype=WORDS["dtype"][dtype], zero=zero, offload=WORDS["offload"][offload])


class RankRows:
    """Builds rank rows, sharing the work of keys that differ only in what it does not depend on
    (the layers and DP communication in ZeRO stage and offload; the optimizer in the layout)."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, bucket_bytes: int, with_ps: bool, max_vpp: int):
        self.model, self.cluster, self.bucket_bytes = model, cluster, bucket_bytes
        self.with_ps, self.max_vpp = with_ps, max_vpp
        self.pricer = CollectivePricer(cluster)
        self._layout: dict[tuple[int, ...], np.ndarray] = {}
        self._step: dict[tuple, np.ndarray] = {}

    def __call__(self, dp: int, tp: int, pp: int, vpp: int, dtype: int, zero: int, offload: int) -> np.ndarray:
        """(pp, R_CHUNK + max_vpp): the rows of one rank key."""
        rows = self._layout_rows(dp, tp, pp, vpp, dtype).copy()
        plan = rank_plan(dp, tp, pp, vpp, dtype, zero, offload)
        for r in range(pp):
            rows[r, R_OPT_STEP:R_COMM] = self._step_columns(plan, rows[r, R_PARAMS])
        return rows

    def _layout_rows(self, dp: int, tp: int, pp: int, vpp: int, dtype: int) -> np.ndarray:
        key = (dp, tp, pp, vpp, dtype)
        if key not in self._layout:
            plan = rank_plan(dp, tp, pp, vpp, dtype)
            per_stage = stage_layers(self.model, plan)
            params = stage_params(self.model, plan)
            rows = np.zeros((pp, R_CHUNK + self.max_vpp))
            rows[:, R_LAYERS] = [sum(per_stage[r + v * pp] for v in range(vpp)) for r in range(pp)]
            rows[:, R_PARAMS] = params
            rows[:, R_COMM:R_CHUNK] = rank_comm_rows(self.model, self.pricer, dp, tp, pp, vpp, dtype, params,
                                                     self.bucket_bytes, self.with_ps)
            for r in range(pp):
                rows[r, R_CHUNK:R_CHUNK + vpp] = [per_stage[r + v * pp] for v in range(vpp)]
            self._layout[key] = rows
        return self._layout[key]

    def _step_columns(self, plan: Plan, params: float) -> np.ndarray:
        key = (plan.dp, plan.tp, plan.dtype, plan.zero, plan.offload, params)
        if key not in self._step:
            step = optimizer_step(self.cluster, plan, params)
            bucket = bucket_all = 0.0
            if plan.offload != "none":
                buckets = dp_buckets(params * state_bytes(plan.dtype).grad, self.bucket_bytes)
                if buckets:
                    bucket = bucket_to_host(self.cluster, plan, buckets[0])[1]
                    bucket_all = len(buckets) * bucket     # every bucket priced as the first (fast.timing)
            self._step[key] = np.array([step.step_s, step.grads_to_host_s, step.params_from_host_s, bucket,
                                        bucket_all, layer_from_host_s(self.cluster, self.model, plan)])
        return self._step[key]


def send_rows(model: ModelSpec, cluster: ClusterSpec, dp: int, tp: int, pp: int, mbs: int, dtype: int) -> np.ndarray:
    """(pp,): seconds of pipeline rank r's send to rank r + 1 (its DP rank 0, TP rank 0 device to
    the next one's), 0 on the last rank."""
    plan = Plan(dp=dp, tp=tp, pp=pp, mbs=mbs, dtype=WORDS["dtype"][dtype])
    nbytes = p2p_bytes(model, plan)
    layout = RankLayout(dp=dp, tp=tp, pp=pp)
    out = np.zeros(pp)
    for r in range(pp - 1):
        out[r] = p2p_time(cluster, nbytes, layout.rank(r, 0, 0), layout.rank(r + 1, 0, 0))
    return out
