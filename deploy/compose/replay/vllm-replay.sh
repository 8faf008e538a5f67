#!/bin/sh
# Demo log writer for the compose stack when no GPU is at hand: replays the startup lines of a real
# vLLM 0.19.0 start (Llama-3.1-8B-Instruct on one H100 80GB HBM3, --gpu-memory-utilization 0.95,
# --max-model-len 8192: 14.99 GiB of weights, 58.11 GiB of KV cache = 476,016 tokens; copied verbatim
# from tests/apriori/logs/meta-llama-llama-3-1-8b---h100-80gb--tp1pp1dp1--8192.log.gz, llm-d's
# accuracy sweep) with timestamps rewritten to now, then appends a stats line every 10 seconds whose
# KV usage climbs from 5 % to 99 % and falls back, so usage, headroom and the KV-full alert move.
# The load is synthetic; the startup and the line formats are vLLM's.
#   usage: vllm-replay.sh STARTUP_LOG OUTPUT_LOG
set -eu
startup=$1
out=$2

stamp() { date +'%m-%d %H:%M:%S'; }

: > "$out"
while IFS= read -r line; do
  now=$(stamp)
  printf '%s\n' "$line" | sed -E "s/ [0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2} / $now /" >> "$out"
  sleep 1
done < "$startup"

i=0
while true; do
  phase=$((i % 40))
  if [ "$phase" -lt 20 ]; then usage=$((5 + phase * 5)); else usage=$((99 - (phase - 20) * 5)); fi
  running=$((usage * 58 / 100))
  waiting=0
  if [ "$usage" -gt 90 ]; then waiting=$(((usage - 90) * 4)); fi
  prompt=$((running * 180))
  gen=$((running * 42))
  printf '(APIServer pid=4801) INFO %s [loggers.py:123] Engine 000: Avg prompt throughput: %d.0 tokens/s, Avg generation throughput: %d.0 tokens/s, Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %d.0%%, Prefix cache hit rate: 12.5%%\n' \
    "$(stamp)" "$prompt" "$gen" "$running" "$waiting" "$usage" >> "$out"
  i=$((i + 1))
  sleep 10
done
