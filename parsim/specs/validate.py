"""The rule table (``rules.RULES``) applied to one plan (``validate``) or to arrays of plans (``plan_mask``).

``validate`` raises SpecError (field, value, what is allowed) for the first broken rule and
returns the list of warnings for legal but questionable choices. ``plan_mask`` evaluates the
same conditions element-wise; tests/test_sweep_enumeration.py holds the two equal plan by plan
over whole sweep spaces.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .cluster import ClusterSpec
from .errors import SpecError
from .model import ModelSpec
from .plan import Plan
from .rules import ADVICE, CHECKS, RULES, PlanView


def validate(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> list[str]:
    peaks = cluster.device.peak_flops
    if plan.dtype not in peaks:      # else the engine would find out mid-run (DeviceProfile.flops)
        raise SpecError("profile.device.peak_flops", sorted(peaks),
                        f"a peak FLOP/s for the plan's dtype {plan.dtype} (profile {cluster.device.name})")
    view = PlanView(plan)
    for applies, holds, rule in CHECKS:
        if (applies is None or applies(view, model, cluster)) and not holds(view, model, cluster):
            raise rule.error(plan, model, cluster)
    return [advice.message(plan, cluster) for advice in ADVICE if advice.applies(view, model, cluster)]


class _Columns:
    """Plans as columns: ``view.tp`` is the array (or one value for every plan) of field ``tp``."""

    def __init__(self, columns: Mapping[str, object]):
        self._columns = columns

    def __getattr__(self, key: str):
        return self._columns[key]


def plan_mask(model: ModelSpec, cluster: ClusterSpec, columns: Mapping[str, object],
              partial: bool = False) -> np.ndarray:
    """True where ``validate`` accepts the plan, for plans held as columns: ``columns[key]`` is
    an integer array over the plans (words as their codes, ``codes.py``; booleans as 0/1), or
    one value shared by all of them (e.g. ``partition=None``). Every rule's fields must be
    present; with ``partial`` a rule reading a field that is not is left out (the mask of the
    rules among the given fields only)."""
    view = _Columns(columns)
    ok = np.ones(np.broadcast_shapes(*(np.shape(v) for v in columns.values() if v is not None)), dtype=bool)
    for rule in RULES:
        missing = [k for k in rule.reads if k not in columns]
        if missing:
            if partial:
                continue
            raise KeyError(f"plan_mask needs column(s) {', '.join(missing)} (rule on {rule.field})")
        applies = rule.applies(view, model, cluster)
        if np.ndim(applies) == 0:
            if applies:
                ok &= rule.holds(view, model, cluster)
            continue        # a rule that applies to none of the plans: its condition is not evaluated
        ok &= ~applies | rule.holds(view, model, cluster)
    return ok
