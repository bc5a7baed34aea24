#!/usr/bin/env bash
# Run a command with this machine's CPU halved, as a slower machine would give it: a busy
# loop per core in a CPU cgroup of its own that always gets what it asks for (the highest
# weight) but never more than half the machine (its quota), so the command has half the
# machine's throughput however busy it is; the loops and the cgroup go when the command
# ends, pass or fail. Without a CPU cgroup to make (not root, no cpu controller) the loops
# run plain at nice 0 and take less than half under load; it says which.
# It prints what a fixed piece of Python work, run once per core at the same time, takes
# before and with the loops, so the run says how much slower it was.
#
#   sudo bash scripts/halved_cpu.sh bash .ci/run     # docs/development.md quotes the figure
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
cores=$(nproc)
alone=$(probe)
group="" how="plain busy loops at nice 0"
if [ -w /sys/fs/cgroup/cpu ] && [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then  # cgroup v1
    group=/sys/fs/cgroup/cpu/capstan-halved-cpu
    mkdir -p "$group"
    echo 262144 >"$group/cpu.shares"
    period=$(cat "$group/cpu.cfs_period_us")
    echo $((period * cores / 2)) >"$group/cpu.cfs_quota_us"
    how="a CPU cgroup (v1) held to $((cores * 50))% of one core"
elif [ -w /sys/fs/cgroup/cgroup.subtree_control ] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then
    echo +cpu >/sys/fs/cgroup/cgroup.subtree_control
    group=/sys/fs/cgroup/capstan-halved-cpu
    mkdir -p "$group"
    echo 10000 >"$group/cpu.weight"
    echo "$((100000 * cores / 2)) 100000" >"$group/cpu.max"
    how="a CPU cgroup (v2) held to $((cores * 50))% of one core"
fi
loops=()
for _ in $(seq "$cores"); do
    sh -c "${group:+echo \$\$ >$group/cgroup.procs; }"'while :; do :; done' &
    loops+=($!)
done
stop_loops() {
    kill "${loops[@]}" 2>/dev/null || true
    wait "${loops[@]}" 2>/dev/null || true
    [ -z "$group" ] || rmdir "$group" 2>/dev/null || true
}
trap stop_loops EXIT
sleep 1
echo "== halved CPU: $cores busy loops in $how; a fixed piece of work on every core takes ${alone} s alone, $(probe) s beside them"
started=$SECONDS
rc=0
"$@" || rc=$?
echo "== halved CPU: the command took $(((SECONDS - started) / 60)) min $(((SECONDS - started) % 60)) s, exit $rc"
exit "$rc"
