"""Another process's CPU, on a schedule: sleep PERIOD_MS, spin BURN_MS, for SECONDS. Run beside an
in-process benchmark (scripts/bench_steps.py) to see what a front end's few hundred microseconds
per token cost an OpenMP team that owns every core (docs/perf/2026-12-02-served-overhead.md).

    python scripts/cpu_disturber.py BURN_MS PERIOD_MS SECONDS &
"""
import sys
import time

burn, period, seconds = float(sys.argv[1]) / 1e3, float(sys.argv[2]) / 1e3, float(sys.argv[3])
end = time.time() + seconds
while time.time() < end:
    time.sleep(period)
    t = time.perf_counter()
    while time.perf_counter() - t < burn:
        pass
