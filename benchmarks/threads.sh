#!/usr/bin/env bash
# Wall time of `approxlab figure1 --quick` with one torch thread per process against one per core.
#
#   bash benchmarks/threads.sh            # from the repository root; REPS=2 by default
#
# A first, untimed run fills a private cache (tokens, Q/K/V) so that the timed runs compare the
# computation only; the timed runs then alternate (1, N, N, 1, ...) so that a change of the
# machine's load reaches both settings alike. Each line gives the 1-minute load average before
# the run: on a shared machine the ratio depends on it, so run this on the machine you care about.
set -euo pipefail
REPS=${REPS:-2}
CORES=$(nproc)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/approxlab-threads.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
unset OMP_NUM_THREADS MKL_NUM_THREADS OPENBLAS_NUM_THREADS
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
study() { python3 -m approxlab figure1 --quick --no-progress --cache-dir "$WORK/cache" "$@" > /dev/null; }

study --threads 1 --out "$WORK/warm"
echo "cores=$CORES  $(python3 -c 'import torch; print("torch", torch.__version__)')"
printf '%-8s %-10s %s\n' threads seconds load1
for rep in $(seq "$REPS"); do
  order="1 $CORES"; [ $((rep % 2)) -eq 0 ] && order="$CORES 1"
  for threads in $order; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    start=$(date +%s.%N)
    study --threads "$threads" --out "$WORK/run-$rep-$threads"
    printf '%-8s %-10.1f %s\n' "$threads" "$(echo "$(date +%s.%N) - $start" | bc)" "$load"
  done
done
