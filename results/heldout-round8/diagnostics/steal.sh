#!/usr/bin/env bash
# Round 8 diagnostic: the hypervisor's steal time (/proc/stat, the cpu line's 8th field, in USER_HZ) around each of
# four fresh-engine probes of mid (hugepages.py): does a slow probe coincide with vCPU time taken by the host?
# Run: bash results/heldout-round8/diagnostics/steal.sh
steal() { awk '/^cpu /{print $9}' /proc/stat; }
for i in 1 2 3 4; do
  a=$(steal); PYTHONPATH=. .venv/bin/python results/heldout-round8/diagnostics/hugepages.py models/heldout-mid 2>&1 | grep -v Warn | tr -d '\n'
  echo "  steal during it: $(( $(steal) - a )) ticks (of ~2 x 100 a second)"
done
