"""Profile YAML out: a header naming the provenance, then the mapping with each table row on
one line and floats at 6 significant digits (``parsim.specs.load_profile_dict`` reads it
back; the calibrated tables in it are ``parsim.specs.CalibratedTables.to_dict``)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import yaml

# What a calibration writes, numbered (``provenance.format``). Raised when the calibration
# measures a table the simulator prices with that older profiles lack (2: the pipeline message's
# CPU, ``p2p_send_cpu`` / ``p2p_recv_cpu`` / ``p2p_cpu_per_byte``; 3: the backward split's own
# cost, ``split_overhead``) or measures one differently (4: the in-situ TP collectives read
# beyond the compute at the host's fair share, withdrawn; 5: read as in format 3 again,
# ``calibration.insitu``; 6: a collective's bytes cost more past a knee, ``knee`` /
# ``beta_beyond``, ``calibration.fit.fit_alpha_beta_knee``; 7: the in-situ latencies over at
# least ``insitu.INSITU_MIN_SAMPLES`` samples, a quick calibration's too; 8: the shared probe's
# compute block timed alone, ``insitu_block_s``, ``CollectiveFit.shared_alpha``; 9: FSDP2's host
# work per unit, ``fsdp_gather_host_s`` / ``fsdp_scatter_host_s``, ``calibration.sharded``, and the
# in-situ latencies over 30 samples; 10: the late start of an action on a pipeline message where
# ranks outnumber cores, ``p2p_hold``, ``calibration.tables.message_hold_curve``; 11: a
# collective's points and fit on the mean of its samples, ``calibration.tables.collective_fits``,
# and a CPU's attention surface on the FLOPs torch's flash kernel executes,
# ``RooflineFit.executed``; 12: the synthetic stages over rounds spread across the run,
# ``calibration.stages.StageRounds``; 13: the collectives measured with the executor's process
# groups held, ``insitu.executor_groups``, and the in-situ latencies over 60 samples; 14: under
# ``PARSIM_HOST_MEMORY=keep`` gloo's worker threads share the main arena, so a collective's
# temporaries over 64 MiB reuse freed memory instead of faulting in fresh pages,
# ``executor.host_alloc``; 15: attention surfaces in every dtype, not the calibrated one alone,
# ``machine_bench.plan_grid``; 16: on CUDA a device-bound stage, ``grid.STAGES`` "stage-wide",
# and the composition terms in the overlapped form, ``StageProbes.overlap``; 17: the GEMM
# contention fitted with the layer's memory-bound ops split by what fits in a rank's cache,
# ``costs.host.dram_share``, ``layer_terms.fit_layer_terms``; 18: how long a pipeline send's
# ``isend`` call holds its rank, ``p2p_send_hold``, ``calibration.tables.send_hold_curve``; 19: a
# CPU's attention surface may price the flash kernel's fixed cost per (head, query block),
# ``RooflineFit.per_block``): a quick
# profile kept for a host by an older calibration is then measured again, not reused
# (``parsim.api.hardware.kept_profile_refused``). Profiles without the key are format 1.
FORMAT = 19


def write_profile(profile: dict[str, Any], path: str | Path) -> Path:
    """Write ``profile`` as YAML (with a header naming its provenance) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prov = profile.get("provenance", {})
    header = (f"# Measured by `parsim calibrate` on {prov.get('host', '?')} ({prov.get('cpu', '?')}), "
              f"{prov.get('date', '?')}.\n# Numbers are medians of repeated runs; re-run the command to "
              f"refresh them rather than editing by hand. SI units: s, bytes, FLOP/s, bytes/s.\n")
    return write_profile_text(path, header, profile)


def write_profile_text(path: str | Path, header: str, profile: dict[str, Any]) -> Path:
    path = Path(path)
    body = yaml.dump(_plain(profile), Dumper=_ProfileDumper, sort_keys=False, width=140)
    from parsim.specs.files import write_text
    return write_text(path, header + body)     # whole or not at all


class _ProfileDumper(yaml.SafeDumper):
    """Safe YAML with each table row (a list of scalars) on one line."""


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = all(not isinstance(x, (list, dict)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _represent_float(dumper: yaml.SafeDumper, x: float) -> yaml.Node:
    """6 significant digits, exponent form for large/small magnitudes; the mantissa keeps a
    dot so YAML 1.1 loaders read it back as a float (``3e+10`` would be a string)."""
    if not math.isfinite(x) or x == 0 or 1e-3 <= abs(x) < 1e6:
        return dumper.represent_float(float(f"{x:.6g}") if math.isfinite(x) else x)
    mantissa, _, exponent = f"{x:.5e}".partition("e")
    mantissa = mantissa.rstrip("0")
    mantissa = mantissa + "0" if mantissa.endswith(".") else mantissa
    return dumper.represent_scalar("tag:yaml.org,2002:float", f"{mantissa}e{exponent}")


_ProfileDumper.add_representer(list, _represent_list)
_ProfileDumper.add_representer(float, _represent_float)


def _plain(x: Any) -> Any:
    """numpy scalars / tuples -> plain YAML types."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x
