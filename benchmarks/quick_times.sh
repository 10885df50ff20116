#!/usr/bin/env bash
# Wall time of each study's `--quick` run, one study at a time (the table of docs/cli.md).
#
#   bash benchmarks/quick_times.sh                      # from the repository root: every study, cold then warm
#   PASSES=cold bash benchmarks/quick_times.sh figure1 sv-decay
#
# cold: a fresh HOME (empty token and Q/K/V caches, APPROXLAB_* unset, default threads); warm: the same HOME
# again, caches filled, into a new --out. Each line gives the 1-minute load average before and after the run:
# on a shared machine the times depend on it. NICE (default 10) is the niceness of every run.
set -uo pipefail
PASSES=${PASSES:-cold warm}
NICE=${NICE:-10}
STUDIES=("$@")
[ ${#STUDIES[@]} -eq 0 ] && STUDIES=(figure1 sv-decay instability bench lra-svd decoder perplexity long-context)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/approxlab-quick.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
unset $(env | grep -o '^APPROXLAB_[A-Z_]*') OMP_NUM_THREADS MKL_NUM_THREADS OPENBLAS_NUM_THREADS
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
echo "cores=$(nproc)  $(python3 -c 'import torch; print("torch", torch.__version__)')"
printf '%-14s %-5s %-5s %-9s %-6s %s\n' study pass rc seconds load1 load1_after
for pass in $PASSES; do
  for study in "${STUDIES[@]}"; do
    home="$WORK/home-$study"
    [ "$pass" = cold ] && rm -rf "$home" && mkdir -p "$home"
    load=$(cut -d' ' -f1 /proc/loadavg)
    start=$(date +%s.%N)
    HOME="$home" nice -n "$NICE" python3 -m approxlab "$study" --quick --no-progress --out "$WORK/out-$study-$pass" \
      > "$WORK/$study-$pass.log" 2>&1
    rc=$?
    printf '%-14s %-5s %-5s %-9.1f %-6s %s\n' "$study" "$pass" "$rc" "$(echo "$(date +%s.%N) - $start" | bc)" \
      "$load" "$(cut -d' ' -f1 /proc/loadavg)"
    [ "$rc" -ne 0 ] && tail -3 "$WORK/$study-$pass.log"
  done
done
