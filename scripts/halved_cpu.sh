#!/usr/bin/env bash
# Run a command with this machine's CPU about halved, as a slower machine would give it:
# one CPU-bound busy loop per core at nice 0 beside it, stopped when the command ends
# (pass or fail). It prints what a fixed piece of Python work, run once per core at the same
# time (the machine's throughput, as the test command's two workers use it), takes before
# and with the loops, so the run says how much slower it was.
#
#   bash scripts/halved_cpu.sh bash .ci/run     # docs/development.md quotes the figure
set -euo pipefail
[ "$#" -gt 0 ] || { echo "usage: $0 COMMAND [ARG...]" >&2; exit 2; }
probe() {
    python3 -c '
import os, time
from concurrent.futures import ProcessPoolExecutor
def work(_):
    t = time.perf_counter()
    sum(i * i for i in range(6_000_000))
    return time.perf_counter() - t
with ProcessPoolExecutor(os.cpu_count()) as pool:
    print(f"{max(pool.map(work, range(os.cpu_count()))):.2f}")'
}
alone=$(probe)
loops=()
for _ in $(seq "$(nproc)"); do
    nice -n 0 sh -c 'while :; do :; done' &
    loops+=($!)
done
stop_loops() { kill "${loops[@]}" 2>/dev/null || true; wait "${loops[@]}" 2>/dev/null || true; }
trap stop_loops EXIT
echo "== halved CPU: $(nproc) busy loops; a fixed piece of work takes ${alone} s alone, $(probe) s beside them"
started=$SECONDS
rc=0
"$@" || rc=$?
echo "== halved CPU: the command took $(((SECONDS - started) / 60)) min $(((SECONDS - started) % 60)) s, exit $rc"
exit "$rc"
