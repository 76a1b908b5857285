"""Study hooks for the executor's ranks, started as fresh interpreters with this folder on their
PYTHONPATH (``studies/validation_cpu/wakeup.py``, ``insitu_in_executor.py``). Each acts only when
its variable is set; unset, nothing happens. Study tools only: nothing in parsim sets them.

* ``PARSIM_STUDY_TICK_S``: a thread that wakes every that many seconds (``wakeup.py``).
* ``PARSIM_STUDY_INSITU`` (a folder): after every layer probe the executor takes (``parsim
  validate``: before each timed step and after the last), the calibration's in-situ TP probe
  (``calibration.insitu.measure_insitu``, world group, ``PARSIM_STUDY_SAMPLES`` samples) runs in
  the same rank processes; rank r appends {t0, {op: [ms per call, per sample]}} to
  ``rank{r}.jsonl`` there (``insitu_in_executor.py``)."""
import os

if os.environ.get("PARSIM_STUDY_TICK_S"):
    import threading
    import time

    _PERIOD_S = float(os.environ["PARSIM_STUDY_TICK_S"])

    def _tick() -> None:
        while True:
            time.sleep(_PERIOD_S)

    threading.Thread(target=_tick, name="study-tick", daemon=True).start()

if os.environ.get("PARSIM_STUDY_INSITU"):
    import json
    import sys
    import time

    import parsim.executor.layer_probe as _layer_probe   # before the trainer imports its name

    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from wakeup import BLOCK as _BLOCK, BYTES as _BYTES   # the probe wakeup.py runs alone

    _probe_layer = _layer_probe.probe_layer

    def _probe_with_insitu(*args, **kwargs):
        result = _probe_layer(*args, **kwargs)
        import torch
        import torch.distributed as dist

        from parsim.calibration.insitu import group_call, measure_insitu
        from parsim.calibration.timer import Clock
        dev = torch.device("cpu")
        x, w = torch.randn(_BLOCK[0], _BLOCK[2]), torch.randn(_BLOCK[1], _BLOCK[2])
        t0 = time.time()
        with torch.no_grad():
            got = measure_insitu(lambda: torch.nn.functional.linear(x, w),
                                 lambda op, nb: group_call(op, nb, None, dist.get_world_size(), dev, dist, torch),
                                 (_BYTES,), int(os.environ.get("PARSIM_STUDY_SAMPLES", "10")), Clock(dev), dist,
                                 torch, dev)
        record = {"t0": t0, "ms": {op: [1e3 * v for values in by_size.values() for v in values]
                                   for op, by_size in got.items()}}
        path = os.path.join(os.environ["PARSIM_STUDY_INSITU"], f"rank{dist.get_rank()}.jsonl")
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
        return result

    _layer_probe.probe_layer = _probe_with_insitu
