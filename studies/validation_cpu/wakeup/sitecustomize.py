"""Start a thread that wakes every ``PARSIM_STUDY_TICK_S`` seconds in every Python process that
imports this (``studies/validation_cpu/wakeup.py`` puts this folder on PYTHONPATH of the
executor's ranks, started as fresh interpreters). Unset: nothing happens. A study tool only."""
import os

if os.environ.get("PARSIM_STUDY_TICK_S"):
    import threading
    import time

    _PERIOD_S = float(os.environ["PARSIM_STUDY_TICK_S"])

    def _tick() -> None:
        while True:
            time.sleep(_PERIOD_S)

    threading.Thread(target=_tick, name="study-tick", daemon=True).start()
