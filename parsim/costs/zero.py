"""What each ZeRO stage shards and which DP collectives it runs (Rajbhandari et al. 2020, Sec. 5).

Functions of numbers (the plan's ``zero``, ``dp``, whether a parameter server reduces): the
memory rules (``costs.footprint``), the optimizer step (``costs.optimizer``) and the SimPy
engine (``sim.engine``, ``sim.dp``) call them with a plan's values, and the fast path compiles
them into its kernels (numba's ``register_jitable``, ``fast.memory`` and ``fast.timing``), so
they use only arithmetic and comparisons.

* stage 0 (DDP): gradients all-reduced in buckets after the rank's last backward;
* stage 1: the buckets reduce-scattered, each rank steps its 1/dp shard of the optimizer, the
  parameters all-gathered after the step (Sec. 5.1);
* stage 2: every backward reduce-scatters each layer's gradients as it completes them (the
  1/dp gradient shard accumulates over microbatches), then as stage 1 (Sec. 5.2);
* stage 3: every action all-gathers each layer's parameters before use, every backward
  reduce-scatters its gradients; nothing is left after the step (Sec. 5.3).
A parameter server (``dp_impl=ps``) replaces the bucketed collectives of stages 0-2.
"""
from __future__ import annotations


def zero_shard(count: float, dp: int, zero: int, stage: int) -> float:
    """The part of ``count`` (parameters, or bytes of one model state) one of ``dp`` ranks holds
    when ZeRO stage ``stage`` is the one that shards it: stage 1 the optimizer states (and the
    parameters each rank steps), 2 the gradients, 3 the parameters; all of it below that stage."""
    return count / (dp if zero >= stage else 1)


def gathers_layers(zero: int, dp: int) -> bool:
    """ZeRO-3 over more than one rank: per-layer parameter all-gathers in every action and
    gradient reduce-scatters in every backward."""
    return zero >= 3 and dp > 1


def scatters_every_backward(zero: int, dp: int, parameter_server: bool) -> bool:
    """ZeRO-2 over more than one rank (without a parameter server): every backward
    reduce-scatters its layers' gradients as it completes them."""
    return zero == 2 and dp > 1 and not parameter_server


def reduce_scatters_buckets(zero: int) -> bool:
    """Are the end-of-step gradient buckets reduce-scattered (ZeRO-1 and up) rather than
    all-reduced (DDP)?"""
    return zero >= 1


def gathers_after_step(zero: int) -> bool:
    """Do the updated parameters get all-gathered after the sharded step (ZeRO-1 and -2)?"""
    return zero == 1 or zero == 2
