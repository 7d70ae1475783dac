#!/usr/bin/env bash
# Round 8 diagnostic, after the test: is the fit models' slow speed the kernel's memory work right after an engine
# maps its 1.3 GB (kcompactd / khugepaged taking CPU from the engine's 2 threads), or the page cache's hold on memory?
# Each probe: a fresh engine of mid in a fresh process (hugepages.py), the kernel threads' CPU seconds around it;
# three probes, then the page cache dropped (echo 3 > /proc/sys/vm/drop_caches), three more.
# Run: bash results/heldout-round8/diagnostics/kernel_threads.sh
cpu() { for t in kcompactd0 khugepaged; do p=$(pgrep -x $t | head -1); [ -n "$p" ] && awk -v n=$t '{printf "%s %.2f s  ", n, ($14+$15)/100}' /proc/$p/stat; done; grep -E "^(MemFree|Cached):" /proc/meminfo | awk '{printf "%s %.1f GiB  ", $1, $2/1048576}'; echo; }
probe() { for i in 1 2 3; do cpu; PYTHONPATH=. .venv/bin/python results/heldout-round8/diagnostics/hugepages.py models/heldout-mid 2>&1 | grep -v Warn; done; cpu; }
echo "# before dropping the page cache"; probe
sync; echo 3 > /proc/sys/vm/drop_caches
echo "# after dropping it"; probe
