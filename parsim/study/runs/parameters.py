"""Which numbers a run log fits, where each starts, and what stacks without runs take.

GPU numbers from a datasheet or an isolated benchmark stay as the profile states them (peak
FLOP/s, HBM and link bandwidths, the isolated GEMM ceiling ``gemm.max_efficiency``, the
published flash-attention rate ``attention_efficiency``). A run log fits what only a whole
training step shows:

* per GPU: ``membound_efficiency`` (elementwise kernels of real layers, bounded by STREAM);
* per (GPU, stack) with runs: the fraction of the GEMM ceiling its training reaches
  (``gemm_efficiency``: library generation, clocks under the node's power cap), its flash
  kernel against the published one (``attention_efficiency``), the host time each op adds
  (``op_overhead_s``), and for stacks that run ZeRO-3 in the log its collectives' share of
  NCCL bandwidth and the compute they slow (``zero_comm_efficiency``, ``comm_compute_slowdown``).

A stack with no runs in the log takes the numbers of the stack its code descends from
(``ANALOGY``), else its preset. Starts and bounds below carry their sources.
"""
from __future__ import annotations

from .observations import Observation, time_like
from .fit import FitParam

# Stacks that run the same kernels (the same layer code) share one set of kernel numbers,
# owned by the first of them the log has runs of.
FAMILIES = (("megatron-lm", "megatron-lm-2021", "deepspeed"),)   # Megatron's GPT layers (v2 / v3 / under ZeRO)
# A stack without runs takes the kernel numbers of the one its code descends from.
FALLBACK = {"megatron-core": "megatron-lm", "megatron-deepspeed": "megatron-lm",   # Megatron layers
            "fsdp2": "fsdp1", "fsdp1": "fsdp2"}                                    # one FSDP runtime family
KERNEL_FIELDS = ("gemm_efficiency", "op_overhead_s")
# A stack without ZeRO-3 runs takes the ZeRO-3 collective numbers of the one whose collectives
# it calls the same way. FSDP1 and FSDP2 both gather a unit's parameters with one
# ``all_gather_into_tensor`` over a flat buffer and reduce-scatter its gradients with one
# ``reduce_scatter_tensor`` (torch.distributed.fsdp: FlatParamHandle; _fully_shard's
# ``foreach_all_gather`` / ``foreach_reduce``), on side streams beside the same compute
# kernels: the share of NCCL bandwidth those calls reach and the compute NCCL's SMs take
# from the kernels beside them are NCCL's and the GPU's, not the wrapper's. FSDP2's extra
# copies into and out of its buffers are priced apart (``costs.fsdp2.fsdp_unit_time``).
# DeepSpeed's per-tensor ZeRO-3 is not such a sibling of either.
ZERO3_FALLBACK = {"fsdp2": "fsdp1"}
# for the profile comments: which stacks may take which numbers from which
ANALOGY = {**{s: (b, KERNEL_FIELDS) for s, b in FALLBACK.items()},
           **{s: (f[0], KERNEL_FIELDS) for f in FAMILIES for s in f[1:]}}


def _family(stack: str) -> tuple[str, ...]:
    return next((f for f in FAMILIES if stack in f), (stack,))


def kernel_owner(stack: str, present: set[str]) -> str | None:
    """The stack whose fitted kernel numbers ``stack`` takes: the first present member of its
    family, else (no runs in the family) that of its fallback's family."""
    owner = next((s for s in _family(stack) if s in present), None)
    if owner is None and stack in FALLBACK:
        owner = next((s for s in _family(FALLBACK[stack]) if s in present), None)
    return owner


# A stack without measured memory takes the allocator (``memory_reserve_bytes``,
# ``fragmentation``) of the first stack in its family that has some. Megatron-LM v2 / v3 and
# Megatron-DeepSpeed (forked from Megatron-LM v2 in 2021) allocate the same tensors in the
# same order: Megatron's GPT layers, its fp16 / bf16 optimizer over fp32 master weights,
# pipeline stages holding whole microbatches of activations, one PyTorch caching allocator of
# that era; the reserve outside it (CUDA context, cuBLAS workspaces, NCCL communicators) is
# the same software. Not carried: ZeRO-3 and FSDP (``deepspeed``, ``fsdp1``, ``fsdp2``)
# gather and free a layer's whole parameters every layer, a different allocation pattern, and
# Megatron-Core (2023-, Transformer Engine, the distributed optimizer's flat parameter and
# gradient buffers): no memory row or relation in the data measures them.
ALLOCATOR_FAMILIES = (("megatron-lm", "megatron-lm-2021", "megatron-deepspeed"),)


def allocator_owner(stack: str, measured: set[str]) -> str | None:
    """The stack whose fitted allocator ``stack`` takes (``measured``: the stacks with memory
    rows): itself if measured, else the first measured member of its family."""
    if stack in measured:
        return stack
    family = next((f for f in ALLOCATOR_FAMILIES if stack in f), ())
    return next((s for s in family if s in measured), None)


# (field, start, lower, upper, source of the start and bounds)
STACK_FIELDS = (
    ("gemm_efficiency", 0.9, 0.4, 1.1,
     "start: 0.9 of the isolated ceiling (the node's power cap; A100 datasheet 400 W); bounds 0.4-1.1"),
    ("op_overhead_s", 2e-5, 1e-7, 1e-3,
     "start: ~20 us per eager PyTorch op on the host (PyTorch dispatcher + launch); bounds 0.1 us-1 ms"),
)
FLASH_FIELDS = (
    ("attention_efficiency", 1.0, 0.2, 1.5,
     "start: the published FlashAttention-2 rate (Dao 2023); bounds 0.2-1.5"),
)
ZERO3_FIELDS = (
    ("zero_comm_efficiency", 0.5, 0.02, 1.0, "start: half of NCCL's bus bandwidth; bounds 0.02-1"),
    ("comm_compute_slowdown", 0.1, 0.001, 0.8,
     "start: ~10 % of the SMs run NCCL channels (8-16 of 108-132); bounds 0.001-0.8"),
)
ZERO3_FIELD_NAMES = tuple(f[0] for f in ZERO3_FIELDS)
GPU_FIELDS = (
    (("device", "membound_efficiency"), 0.8, 0.4, 0.92,
     "start: 0.8 of HBM bandwidth; upper bound 0.92: STREAM copy on A100 / H100 (~0.9 of datasheet)"),
)


def fit_parameters(observations: list[Observation], profiles: dict[str, dict]) -> list[FitParam]:
    """The parameters the timing rows can inform: GPU numbers for every profile with rows,
    stack numbers for every (profile, stack) with rows (flash and ZeRO-3 terms only where the
    stack's runs use them)."""
    rows = [o for o in observations if time_like(o)]
    out: list[FitParam] = []
    for profile in sorted({o.profile for o in rows}):
        mine = [o for o in rows if o.profile == profile]
        for path, start, lo, hi, src in GPU_FIELDS:
            out.append(FitParam(profile, path, start, lo, hi, None, src))
        present = {o.stack for o in mine}
        from parsim.specs.stack import STACKS
        for stack in sorted(present):
            runs = [o for o in mine if o.stack == stack]
            owns = kernel_owner(stack, present) == stack
            tied = tuple(s for s in STACKS if s != stack and kernel_owner(s, present) == stack)
            fields = list(STACK_FIELDS) if owns else []
            if any(o.model.flash_attention or _flash(stack) for o in runs) and _flash(stack):
                fields += FLASH_FIELDS
            if _runs_zero3(stack, runs):
                fields += ZERO3_FIELDS
            zero3_tied = tuple(s for s, b in ZERO3_FALLBACK.items() if b == stack and not _runs_zero3(s, mine))
            for name, start, lo, hi, src in fields:
                t = tied if name in KERNEL_FIELDS else zero3_tied if name in ZERO3_FIELD_NAMES else ()
                start, src = _prior(stack, name, start, src)
                out.append(FitParam(profile, ("device", "stacks", stack, name), start, lo, hi, stack, src, t))
    return out


def _runs_zero3(stack: str, rows: list[Observation]) -> bool:
    """Does any of ``rows`` run ``stack`` with ZeRO-3 over more than one rank?"""
    return any(p.zero == 3 and p.dp > 1 for o in rows if o.stack == stack for p in o.plans)


def _prior(stack: str, name: str, start: float, src: str) -> tuple[float, str]:
    """A stack preset's own documented value of a number, where it states one, is the start."""
    from parsim.specs.stack import STACK_PRESETS, Stack
    value = getattr(STACK_PRESETS[stack], name)
    default = getattr(Stack("x", ""), name)
    if value != default and value:
        return float(value), f"start: the {stack} preset's value (parsim.specs.stack)"
    return start, src


def _flash(stack: str) -> bool:
    from parsim.specs.stack import get_stack
    return bool(get_stack(stack).flash_attention)
