"""What the dry run (`inferlab run CONFIG --dry-run`, experiments/dry_run.py) checks a launch
command and the request bodies against: each engine's own code where it imports on this machine
(vllm_check.py runs in .venv-vllm, sglang_check.py in .venv-sglang), else the flag tables and
request models recorded from upstream's source at the pinned tag, every fact citing file@tag
(trtllm.json, tgi.json; the tables and how they were read: tests/adapters/fixtures/<engine>/SOURCE.md).
"""
