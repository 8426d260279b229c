#!/usr/bin/env bash
# The guest kernel's CPU and memory counters once a second, to lay against a bench's requests
# (benchmarks/guest_counters.py): /proc/stat's cpu line (user nice system idle iowait irq softirq
# steal ...), /proc/vmstat's pgfault, pgmajfault, compact_stall, thp_fault_alloc,
# thp_collapse_alloc, and khugepaged's CPU ticks (its pid: pgrep khugepaged).
#     bash benchmarks/guest_counters.sh > counters.log &   # while the bench runs; kill it after
pid=$(pgrep -x khugepaged || echo 0)
while true; do
  v=$(grep -E "^(thp_fault_alloc|thp_collapse_alloc|compact_stall|pgfault|pgmajfault) " /proc/vmstat | awk '{printf "%s ", $2}')
  k=$( [ "$pid" != 0 ] && awk '{print $14+$15}' /proc/$pid/stat || echo 0)
  echo "$(date +%s.%N) | $(head -1 /proc/stat) | $v | $k"
  sleep 1
done
