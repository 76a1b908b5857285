"""Integer codes shared by the numba kernels: the plan words' codes (defined once, in
``parsim.specs.codes``: a word's index in the specs' tuple), and the column layout of the
outputs."""
from __future__ import annotations

from parsim.specs.codes import (GPIPE, INTERLEAVED, NAIVE, OFF_NONE, OFF_OPT, OFF_OPT_PARAMS,  # noqa: F401
                                ONE_F_ONE_B, PS)

# output columns of one plan
(O_STEP, O_PIPE, O_BUBBLE, O_TP, O_DP, O_PP, O_PEAK, O_PEAK_STAGE, O_PARAMS, O_GRADS, O_OPT, O_ACT,
 O_OTHER, O_WIDTH) = range(14)
