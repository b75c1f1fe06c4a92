#!/bin/bash
# Resident memory of the comparison harness's processes and their vLLM evaluation children, sampled every 30 s
# (the peaks quoted in docs/results.md, "Regime benchmark"). Usage: nohup benchmarks/rss_monitor.sh rss.log &   (stop it with kill when the runs end)
# Each line: time, pid, resident GB, the command line. Peak per process:
#   awk '{sub("GB", "", $3); if ($3 + 0 > m[$2] + 0) m[$2] = $3 + 0} END {for (p in m) print p, m[p] " GB"}' rss.log
out=${1:-rss.log}
while true; do
  ts=$(date +%H:%M:%S)
  ps -eo pid,rss,args --no-headers | grep -E "compare_trainers.py|vllm_eval.py" | grep -v grep |
    awk -v ts="$ts" '{printf "%s %s %.1fGB %s\n", ts, $1, $2 / 1048576, substr($0, index($0, $3), 160)}' >> "$out"
  sleep 30
done
