"""Costs: pure functions of (model, plan[, cluster]) -> FLOPs, bytes, seconds. SI units."""
from .activations import embedding_activation_bytes, head_activation_bytes, layer_activation_bytes
from .comm import (Collective, dp_buckets, dp_grad_bytes, dp_param_bytes, microbatch_activation_bytes, p2p_bytes,
                   p2p_holds_sender,
                   tp_collectives_edge, tp_collectives_per_layer, zero3_gather_bytes_per_layer,
                   zero3_reduce_scatter_bytes_per_layer)
from .flops import eq3_flops, hardware_flops_per_step, model_flops_per_step
from .fsdp2 import reduce_scatter_copies
from .inflight import Moment, inflight_chunks, inflight_microbatches, peak_held, peak_moments
from .memory import (CATEGORIES, StageFootprint, StageMemory, device_capacity, first_backward_apart, fits,
                     footprints_apart, memory_by_stage, optimizer_step_bytes, stage_footprints, static_bytes,
                     unmade_grads)
from .optimizer import OptimizerStep, optimizer_step
from .ops import DTYPE_BYTES, Op, embedding_ops, head_ops, layer_ops, padded_vocab
from .params import (embedding_params, eq2_params, head_params, layer_params, layer_tensors, optimizer_tensor_sizes,
                     optimizer_tensors, stage_params, stage_tensors, step_windows, total_params)
from .recompute import (fewest_recomputed, layer_recompute, recomputed_ops, recomputes_collectives, recomputes_fully,
                        rerun, stage_policy, stage_recompute, stops_early)
from .stage_aware import stage_aware_recompute_layers
from .states import StateBytes, model_state_bytes, plan_state_bytes, state_bytes, zero_model_state_bytes
from .zero import zero_shard

__all__ = [n for n in dir() if not n.startswith("_")]
