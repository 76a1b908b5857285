"""The fast path: a numba closed-form evaluator of step time and memory over arrays of plans.

``evaluate(model, cluster, PlanTable) -> FastResult`` prices hundreds of thousands of plans per
second per core; the SimPy engine (``parsim.sim``) re-runs the best of them in detail.
"""
from .jit_cache import keyed_numba_cache

with keyed_numba_cache():
    from .evaluate import FastResult, evaluate
    from .plans import COLUMNS, PlanTable, product_table, valid_mask

__all__ = ["FastResult", "evaluate", "PlanTable", "COLUMNS", "product_table", "valid_mask"]
