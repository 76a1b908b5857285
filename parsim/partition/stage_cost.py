"""What one pipeline stage made of segments [a, b) costs: time per microbatch and peak memory.

Memory of a stage under its schedule (per device):
    model states  = params x (param + grad + optimizer bytes), ZeRO-sharded over dp
                    (Megatron-LM state bytes; Rajbhandari et al. 2020 Sec. 5; parsim.costs.memory)
    activations   = in-flight microbatches x bytes saved per microbatch, with in-flight from
                    ``costs.inflight.rank_inflight`` of the rank holding the stage (1F1B:
                    min(p - i, m), Narayanan et al. 2021 Sec. 2.2.1; walked for the zero-bubble family)
    gathered      = ZeRO-3's gathered layers (analytic graphs: ``costs.memory.gathered_bytes``)
or, where that weighs more, at its optimizer step (after its last backward, every activation
freed): model states + the step's temporaries (``costs.footprint.optimizer_temporaries`` of its
loop over the stage's parameter tensors, under the plan's stack).
A stage that recomputes r of its layers keeps only their inputs (Chen et al. 2016), pays their
forward again in backward, and briefly holds one layer's full activations while recomputing
it (as ``parsim.costs.memory_by_stage``). Which layers recompute follows the stage's
``costs.stage_policy``: ``full`` all of them, ``stage-aware`` the fewest leading ones that fit
(``costs.fewest_recomputed``; Merak, Lai et al. 2023, Sec. 5.2), ``none``/``selective`` none
(selective is folded into the layer costs; the last pipeline rank under Merak's shifted
critical path). With vpp > 1 a rank's budget is split evenly over its vpp chunks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from parsim.costs import fewest_recomputed, model_state_bytes, plan_state_bytes, stage_policy
from parsim.costs.inflight import rank_inflight
from parsim.costs.placement import rank_of_stage
from parsim.costs.footprint import held_bytes, optimizer_step_peaks, optimizer_temporaries, step_window
from parsim.specs import Plan, plan_stack

from .graph import CostGraph, Segment, UnionSum


@dataclass(frozen=True)
class StageCost:
    time_s: float            # forward + backward (+ recompute) of one microbatch, seconds
    fwd_s: float
    bwd_s: float             # includes recomputation
    memory_bytes: float      # peak: model states + in-flight activations (+ recompute transient)
    state_bytes: float
    activation_bytes: float  # in-flight activations at the peak
    recompute_layers: int
    fits: bool
    # the memory-bound and collective shares of fwd_s / bwd_s (``CostNode``)
    fwd_membound_s: float = 0.0
    bwd_membound_s: float = 0.0
    fwd_comm_s: float = 0.0
    bwd_comm_s: float = 0.0

    def host_jobs(self) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
        """Forward and backward as (fixed, GEMM, memory-bound) solo seconds: the jobs a host
        shared by several ranks runs (``costs.sharing.ProcessorSharing.run``); collectives are fixed."""
        def split(total: float, membound: float, comm: float) -> tuple[float, float, float]:
            return comm, max(total - membound - comm, 0.0), membound
        return (split(self.fwd_s, self.fwd_membound_s, self.fwd_comm_s),
                split(self.bwd_s, self.bwd_membound_s, self.bwd_comm_s))


def state_bytes_per_param(plan: Plan) -> float:
    """Bytes of params + grads + optimizer per parameter on one device (ZeRO / offload applied,
    ``costs.model_state_bytes`` of one parameter)."""
    p, g, o = model_state_bytes(1.0, plan)
    return p + g + o


class StageCoster:
    """Prices stages over a fixed segment list, in O(log n) per stage via prefix sums."""

    def __init__(self, graph: CostGraph, segments: list[Segment], plan: Plan, memory_limit: float):
        self.segments = segments
        self.plan = plan
        self.stage_limit = memory_limit / plan.vpp
        n = len(segments)
        self.per_param = state_bytes_per_param(plan)

        def prefix(values):
            out = [0.0]
            for v in values:
                out.append(out[-1] + v)
            return out

        self.fwd = prefix(s.fwd_s for s in segments)
        self.bwd = prefix(s.bwd_s for s in segments)
        self.act = prefix(s.activation_bytes for s in segments)
        self.rec_s = prefix(s.recompute_s for s in segments)
        self.fwd_mb = prefix(s.fwd_membound_s for s in segments)
        self.bwd_mb = prefix(s.bwd_membound_s for s in segments)
        self.fwd_comm = prefix(s.fwd_comm_s for s in segments)
        self.bwd_comm = prefix(s.bwd_comm_s for s in segments)
        self.rec_mb = prefix(s.recompute_membound_s for s in segments)
        self.rec_comm = prefix(s.recompute_comm_s for s in segments)
        self.saving = prefix(s.recompute_saving_bytes for s in segments)
        self.layers = prefix(s.layers for s in segments)
        param_uses: dict[str, tuple[float, list[int]]] = {}
        common_uses: dict[int, tuple[float, list[int]]] = {}
        common_mb_uses: dict[int, tuple[float, list[int]]] = {}
        for i, s in enumerate(segments):
            for p in s.params:
                param_uses.setdefault(p, (graph.param_numel.get(p, 0.0), []))[1].append(i)
            for c in s.common:
                common_uses.setdefault(c, (graph.common[c].fwd_s, []))[1].append(i)
                common_mb_uses.setdefault(c, (graph.common[c].fwd_membound_s, []))[1].append(i)
        self.param_numel = UnionSum(param_uses, n)
        self.common_fwd = UnionSum(common_uses, n)
        self.common_fwd_mb = UnionSum(common_mb_uses, n)
        self._cache: dict[tuple, StageCost] = {}
        self.graph = graph
        self.grad_bytes = plan_state_bytes(plan).grad

    def inflight(self, stage: int) -> float:
        return rank_inflight(self.plan, rank_of_stage(self.plan, stage))

    def cost(self, stage: int, a: int, b: int) -> StageCost:
        last = self.plan.pp * self.plan.vpp - 1
        key = (self.inflight(stage), stage_policy(self.plan, stage), stage == 0, stage == last, a, b)
        if key not in self._cache:
            self._cache[key] = self._cost(*key)
        return self._cache[key]

    def _working(self, first: bool, last: bool, a: int, b: int) -> Callable[[float, float], float]:
        """What the stage's backward holds beyond its stored activations, as a function of the
        bytes one microbatch stores, of a layer's recompute transient (held by a layer's
        backward only, ``footprint.backward_working``) and of how many layers recompute fully: the graph's own model (analytic graphs:
        ``costs.activations.backward_working_bytes``), else the gradient of its largest weight,
        built before it is added into ``.grad`` (the term that dominates the executor's layers,
        tests/test_memory_model.py), beside the transient."""
        if self.graph.backward_working is not None:
            return lambda stash, transient, recomputed: self.graph.backward_working(first, last, stash, transient,
                                                                                   recomputed)
        names = {p for s in self.segments[a:b] for p in s.params}
        largest = self.grad_bytes * max((self.graph.param_numel.get(p, 0.0) for p in names), default=0.0)
        return lambda stash, transient, recomputed: largest + transient

    def _step_temporaries(self, a: int, b: int) -> float:
        """``footprint.optimizer_temporaries`` of the stage's parameters stepped in program order
        (``footprint.step_window``): each name's largest tensor, read as one matrix (an analytic
        graph's layer, embedding or head: its largest weight beside the name's before it; a
        traced graph names tensors, the few vectors among them are a norm's or a bias's)."""
        names = list(dict.fromkeys(p for s in self.segments[a:b] for p in s.params))
        graph, stack = self.graph, plan_stack(self.plan)
        tensors = [(graph.param_largest.get(p, graph.param_numel.get(p, 0.0)), True) for p in names]
        window = step_window(tensors, stack.optimizer_temporaries, stack.optimizer_carry)
        return optimizer_temporaries(window, self.plan.dp, self.plan.zero, stack.zero1_whole_tensors,
                                     self.plan.offload != "none")

    def _cost(self, inflight: float, policy: str, first: bool, last: bool, a: int, b: int) -> StageCost:
        states = self.param_numel(a, b) * self.per_param
        fwd = self.fwd[b] - self.fwd[a] + self.common_fwd(a, b)
        bwd = self.bwd[b] - self.bwd[a]
        act = self.act[b] - self.act[a]
        # a non-last stage keeps the output it sent until that microbatch's backward
        if last:
            output = 0.0
        elif self.graph.output_bytes is not None:
            output = self.graph.output_bytes
        else:
            output = self.segments[b].input_bytes if b < len(self.segments) else 0.0

        working = self._working(first, last, a, b)
        temporaries = self._step_temporaries(a, b)

        def memory(r: int) -> tuple[float, float]:
            stash = act - (self.saving[a + r] - self.saving[a])
            held = inflight * held_bytes(stash, last, output)
            # the segment being recomputed holds its full activations again for a moment
            transient = max((self.segments[i].recompute_saving_bytes for i in range(a, a + r)), default=0.0)
            backward = held + working(stash, transient, r) + self.graph.gathered_bytes
            if optimizer_step_peaks(backward, temporaries, 0.0):
                return states + temporaries, 0.0
            return states + backward, held

        n_seg = b - a
        if policy == "full":
            r = n_seg
        elif policy == "stage-aware":    # the fewest leading segments whose recomputation makes it fit
            fewest = fewest_recomputed(n_seg, lambda k: memory(k)[0], self.stage_limit)
            r = n_seg if fewest is None else fewest
        else:
            r = 0
        total, held = memory(r)
        bwd += self.rec_s[a + r] - self.rec_s[a]
        layers = int(round(self.layers[a + r] - self.layers[a]))
        return StageCost(
            time_s=fwd + bwd, fwd_s=fwd, bwd_s=bwd, memory_bytes=total, state_bytes=states, activation_bytes=held,
            recompute_layers=layers, fits=total <= self.stage_limit,
            fwd_membound_s=self.fwd_mb[b] - self.fwd_mb[a] + self.common_fwd_mb(a, b),
            bwd_membound_s=self.bwd_mb[b] - self.bwd_mb[a] + self.rec_mb[a + r] - self.rec_mb[a],
            fwd_comm_s=self.fwd_comm[b] - self.fwd_comm[a],
            bwd_comm_s=self.bwd_comm[b] - self.bwd_comm[a] + self.rec_comm[a + r] - self.rec_comm[a])
