"""The fast path's rows per pipeline rank, priced by ``parsim.costs`` once per distinct key.

* rank key (dp, tp, pp, vpp, dtype, placement): per pipeline rank its layers
  (``specs.stage_layers``, placed as the schedule places its stages: loop or V,
  ``costs.placement``) in all and per model chunk, which of its chunks holds the output head, its
  parameters (``costs.stage_params``) and the fp32 elements its optimizer step's loop holds at
  its heaviest (``costs.step_windows``: of all its tensors, and of its heaviest ZeRO-1 replica's
  where tensors go whole), its DP communication (``fast.comm.rank_comm_rows``), and
  for each (ZeRO stage, offload) its optimizer step (its bytes and, where the profile prices it,
  its parameter tensors: ``costs.optimizer.rank_tensors``) and ZeRO-Offload's host transfers
  (``costs.optimizer``: the same ``OptimizerStep`` the SimPy engine plays at the end of the step);
* send key (dp, tp, pp, mbs, dtype, schedule): per pipeline rank r the seconds of its send to
  rank r + 1, and the last rank's to rank 0 (a loop's turn to the next chunk)
  (``costs.timing.p2p_time`` of ``costs.p2p_bytes`` between the two ranks' devices, as the
  table's software stack sends it; it is the same both ways, ``send_between``); then one more
  entry, ``S_HOLDS``: 1 where a send holds its sender (``costs.p2p_holds_sender``), else 0.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from numba.extending import register_jitable

from parsim.costs import (dp_buckets, optimizer_step, p2p_bytes, p2p_holds_sender, stage_params, step_windows,
                          plan_state_bytes)
from parsim.costs.optimizer import bucket_to_host, layer_from_host_s, rank_tensor_sizes, rank_tensors
from parsim.costs.params import zero1_owned_params
from parsim.costs.placement import stages_of_rank
from parsim.costs.timing import p2p_time
from parsim.specs import ClusterSpec, ModelSpec, Plan, RankLayout, stage_layers
from parsim.specs.stack import AUTO

from .comm import C_WIDTH, CollectivePricer, rank_comm_rows
from .plans import WORDS

# rank table columns: layers, parameters, the chunk holding the output head (-1: none), the
# elements of the optimizer step's temporaries at its heaviest (``costs.step_windows``), the
# parameters a ZeRO-1 replica owns at most where tensors go whole (``params.zero1_owned_params``)
# and that replica's step window, the fast.comm columns, the optimizer blocks (one per (zero,
# offload), ``step_block``), then layers per model chunk
R_LAYERS, R_PARAMS, R_LAST, R_WINDOW, R_OWNED, R_WINDOW_OWNED, R_COMM = 0, 1, 2, 3, 4, 5, 6
R_STEP = R_COMM + C_WIDTH
# an optimizer block (seconds): ``costs.OptimizerStep``'s step, gradient shard down, parameter
# shard up; a reduced bucket's shard down and all the buckets'; ZeRO-Infinity's layer shard up
S_OPT_STEP, S_GRADS_DOWN, S_PARAMS_UP, S_BUCKET_DOWN, S_BUCKETS_DOWN, S_LAYER_UP, S_WIDTH = range(7)
ZERO_STAGES, OFFLOADS = 4, len(WORDS["offload"])
R_CHUNK = R_STEP + ZERO_STAGES * OFFLOADS * S_WIDTH


@register_jitable
def step_block(zero, offload):
    """First column of the optimizer block of a plan's ZeRO stage and offload code (ints, or
    numba ints in the kernel)."""
    return R_STEP + (zero * OFFLOADS + offload) * S_WIDTH


@register_jitable
def send_between(send, a, b):
    """Seconds of a pipeline send between ranks ``a`` and ``b`` of a plan whose send rows are
    ``send`` (``send_rows``): 0 on one rank (a V's turn), else the pair's entry."""
    if a == b:
        return 0.0
    lo, hi = min(a, b), max(a, b)
    return send[lo] if hi == lo + 1 else send[hi]


def rank_plan(dp: int, tp: int, pp: int, vpp: int, dtype: int, zero: int = 0, offload: int = 0,
              v_placed: int = 0, stack: str = AUTO) -> Plan:
    """A plan with this layout whose schedule places its stages in a loop (``v_placed`` 0) or in
    a V (1: zbv; ``costs.placement``), run by ``stack`` (its vocabulary padding sizes the
    embedding and the head)."""
    return Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, dtype=WORDS["dtype"][dtype], zero=zero, offload=WORDS["offload"][offload],
                schedule="zbv" if v_placed else "1f1b", stack=stack)


class RankRows:
    """Builds the rows of rank keys; ``steps``: the (zero, offload) codes whose optimizer blocks
    are filled in (the sweep's; the others stay 0)."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, bucket_bytes: int, with_ps: bool, max_vpp: int,
                 steps: list[tuple[int, int]], stack: str = AUTO):
        self.model, self.cluster, self.bucket_bytes, self.stack = model, cluster, bucket_bytes, stack
        self.with_ps, self.max_vpp, self.steps = with_ps, max_vpp, steps
        self.step_columns = np.array([step_block(z, o) + i for z, o in steps for i in range(S_WIDTH)], dtype=np.int64)
        self.pricer = CollectivePricer(cluster)
        self._blocks: dict[tuple, np.ndarray] = {}
        self._plans: dict[tuple, tuple[Plan, float]] = {}
        self._sizes: dict[tuple[float, ...], int] = {}     # tensor sizes -> id (a key column)
        self._sized: list[tuple[float, ...]] = []

    def __call__(self, dp: int, tp: int, pp: int, vpp: int, dtype: int, v_placed: int = 0) -> np.ndarray:
        """(pp, R_CHUNK + max_vpp): the rows of one rank key."""
        plan = rank_plan(dp, tp, pp, vpp, dtype, v_placed=v_placed, stack=self.stack)
        per_stage = stage_layers(self.model, plan)
        params = stage_params(self.model, plan)
        rows = np.zeros((pp, R_CHUNK + self.max_vpp))
        held = [stages_of_rank(plan, r) for r in range(pp)]
        rows[:, R_LAYERS] = [sum(per_stage[s] for s in stages) for stages in held]
        rows[:, R_PARAMS] = params
        last = pp * vpp - 1
        rows[:, R_LAST] = [stages.index(last) if last in stages else -1 for stages in held]
        rows[:, R_WINDOW] = step_windows(self.model, plan)
        if self._zero1_plan(plan).zero == 1:       # a ZeRO-1 replica's states and step (fast.memory), where the sweep has them
            rows[:, R_OWNED] = zero1_owned_params(self.model, plan)
            rows[:, R_WINDOW_OWNED] = step_windows(self.model, plan, replicas=True)
        head_rank = next(r for r, stages in enumerate(held) if last in stages)
        rows[:, R_COMM:R_STEP] = rank_comm_rows(self.model, self.pricer, dp, tp, pp, vpp, dtype, params,
                                                self.bucket_bytes, self.with_ps, head_rank, self.stack)
        # the optimizer blocks depend on the layout only through the rank's parameters and the
        # tensors its step loops over (all it holds; ZeRO-1: a replica's most)
        keys = np.column_stack([params, rank_tensors(self.cluster, self.model, plan), self._zero1_tensors(plan),
                                self._size_ids(plan), self._size_ids(self._zero1_plan(plan))])
        distinct, rank_of = np.unique(keys, axis=0, return_inverse=True)
        blocks = np.array([self._step_blocks(dp, tp, dtype, *key) for key in distinct.tolist()])
        rows[:, self.step_columns] = blocks.reshape(len(distinct), -1)[rank_of.reshape(-1)]
        for r, stages in enumerate(held):
            rows[r, R_CHUNK:R_CHUNK + vpp] = [per_stage[s] for s in stages]
        return rows

    def _zero1_plan(self, plan: Plan) -> Plan:
        """The plan whose tensors a ZeRO-1 step loops over, where the sweep has ZeRO-1 plans with
        dp > 1 (otherwise ``plan``: as many as the others')."""
        if plan.dp > 1 and any(zero == 1 for zero, _ in self.steps):
            return replace(plan, zero=1)
        return plan

    def _zero1_tensors(self, plan: Plan) -> list[float]:
        """Per pipeline rank: the tensors a ZeRO-1 step loops over (``rank_tensors``)."""
        return rank_tensors(self.cluster, self.model, self._zero1_plan(plan))

    def _size_ids(self, plan: Plan) -> list[float]:
        """Per pipeline rank: the id of the sizes of the tensors its step loops over
        (``rank_tensor_sizes``), an exact key column."""
        out = []
        for sizes in rank_tensor_sizes(self.cluster, self.model, plan):
            if sizes not in self._sizes:
                self._sizes[sizes] = len(self._sized)
                self._sized.append(sizes)
            out.append(float(self._sizes[sizes]))
        return out

    def _step_blocks(self, dp: int, tp: int, dtype: int, params: float, tensors: float,
                     zero1_tensors: float, sizes_id: float, zero1_sizes_id: float) -> np.ndarray:
        """The optimizer blocks (``steps``, one after another) of a rank holding ``params``
        parameters in ``tensors`` tensors of the sizes ``sizes_id`` (``zero1_*`` its ZeRO-1
        step's; memoised: ranks of many layouts hold as many)."""
        key = (dp, tp, dtype, params, tensors, zero1_tensors, sizes_id, zero1_sizes_id)
        if key not in self._blocks:
            sizes, zero1_sizes = self._sized[int(sizes_id)], self._sized[int(zero1_sizes_id)]
            self._blocks[key] = np.array([
                x for zero, offload in self.steps
                for x in self._step_columns(dp, tp, dtype, zero, offload, params,
                                            zero1_tensors if zero == 1 else tensors,
                                            zero1_sizes if zero == 1 else sizes)])
        return self._blocks[key]

    def _step_columns(self, dp: int, tp: int, dtype: int, zero: int, offload: int, params: float,
                      tensors: float, sizes: tuple[float, ...] = ()) -> list[float]:
        """The optimizer block of a rank holding ``params`` parameters, whose step loops over
        ``tensors`` tensors of ``sizes`` elements, under (zero, offload)."""
        if (dp, tp, dtype, zero, offload) not in self._plans:
            plan = rank_plan(dp, tp, 1, 1, dtype, zero, offload, stack=self.stack)
            self._plans[dp, tp, dtype, zero, offload] = plan, layer_from_host_s(self.cluster, self.model, plan)
        plan, layer_up = self._plans[dp, tp, dtype, zero, offload]
        step = optimizer_step(self.cluster, plan, params, tensors, sizes)
        bucket = bucket_all = 0.0
        if plan.offload != "none":
            buckets = dp_buckets(params * plan_state_bytes(plan).grad, self.bucket_bytes)
            if buckets:
                bucket = bucket_to_host(self.cluster, plan, buckets[0])[1]
                bucket_all = len(buckets) * bucket     # every bucket priced as the first (fast.timing)
        return [step.step_s, step.grads_to_host_s, step.params_from_host_s, bucket, bucket_all, layer_up]


def send_rows(model: ModelSpec, cluster: ClusterSpec, dp: int, tp: int, pp: int, mbs: int, dtype: int,
              schedule: int = 0, stack: str = AUTO) -> np.ndarray:
    """(pp + 1,): seconds of pipeline rank r's send to rank r + 1 (its DP rank 0, TP rank 0
    device to the next one's); on the last rank its send to rank 0 (0 without pipelining); the
    bytes as ``stack``'s pipeline sends them; last, whether the sends hold their sender under
    ``schedule`` (a code of ``WORDS["schedule"]``; ``S_HOLDS``)."""
    plan = Plan(dp=dp, tp=tp, pp=pp, mbs=mbs, dtype=WORDS["dtype"][dtype], stack=stack)
    nbytes = p2p_bytes(model, plan)
    layout = RankLayout(dp=dp, tp=tp, pp=pp)
    out = np.zeros(pp + 1)
    for r in range(pp if pp > 1 else 0):
        out[r] = p2p_time(cluster, nbytes, layout.rank(r, 0, 0), layout.rank((r + 1) % pp, 0, 0))
    out[pp] = float(p2p_holds_sender(plan, WORDS["schedule"][schedule]))
    return out
