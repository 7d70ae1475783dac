"""`inferlab run --dry-run`: the launch plan and request bodies of every adapter, checked against
upstream before any GPU minute is billed (dryrun.py: the checks; contracts.py: what every server
adapter adds, calling its engine's own contract in adapters/engines/<name>/contract.py)."""
