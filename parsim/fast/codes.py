"""Integer codes shared by the numba kernels: the plan words' codes (defined once, in
``parsim.specs.codes``: a word's index in the specs' tuple), and the column layout of the
outputs and of the cluster's link row."""
from __future__ import annotations

from parsim.specs.codes import (GPIPE, INTERLEAVED, NAIVE, OFF_NONE, OFF_OPT, OFF_OPT_PARAMS,  # noqa: F401
                                ONE_F_ONE_B, PS, RC_FULL, RC_STAGE_AWARE)

# output columns of one plan
(O_STEP, O_PIPE, O_BUBBLE, O_TP, O_DP, O_PP, O_PEAK, O_PEAK_STAGE, O_PARAMS, O_GRADS, O_OPT, O_ACT,
 O_OTHER, O_WIDTH) = range(14)

# link row: intra bw, intra alpha, inter bw, inter alpha, host bw, host alpha, p2p calibrated?, alpha, beta,
# devices per node, membound rate for the optimizer (bytes/s), kernel overhead (s), host memory bandwidth (bytes/s),
# compute seconds lost per second of collective overlapping it on a GPU (``costs.stack.comm_compute_slowdown``)
(K_INTRA_BW, K_INTRA_A, K_INTER_BW, K_INTER_A, K_HOST_BW, K_HOST_A, K_P2P_CAL, K_P2P_A, K_P2P_B, K_DPN,
 K_MEMBOUND_BW, K_OVERHEAD, K_HOST_MEM_BW, K_COMM_SLOWDOWN, K_WIDTH) = range(15)
