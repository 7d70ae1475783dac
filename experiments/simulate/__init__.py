"""`inferlab simulate` (issue 40): predict a run before it runs, and plan capacity.

Stages, one file each: step_model (a step's seconds from roofline terms and a device profile),
replica (the reference engine's real Scheduler and KV-cache manager, stepped without a model),
served + replay (that replica behind the harness's Engine interface on the simulated clock: the
same runner, records and report as `inferlab run`), sweep + calibrate (time step shapes on the real
engine, fit the profile), fleet + router + capacity (N replicas behind a router, the SLO search at
10^5 requests), cli. profiles/: spec-sheet profiles, uncalibrated. bench.py: the validation
(`make simulate-bench`, docs/perf/2026-12-04-simulate.md).
"""
