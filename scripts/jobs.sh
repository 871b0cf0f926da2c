#!/usr/bin/env bash
# How many parallel build and test jobs this machine can take: the CPUs this process may run on (nproc), no more
# than a cgroup v2 CPU quota allows (nproc does not see quotas: a container capped at 2 CPUs on a large host would
# otherwise run dozens of compilers), and no more than one per 3 GiB of available memory (one ASan compile of a large
# test file takes about 2.4 GB). Prints one number, at least 1.
n=$(nproc 2>/dev/null || echo 1)
quota=$(cat /sys/fs/cgroup/cpu.max 2>/dev/null || true)
case "$quota" in
  [0-9]*)
    q=$(( ${quota%% *} / ${quota##* } ))
    if [ "$q" -ge 1 ] && [ "$q" -lt "$n" ]; then n=$q; fi ;;
esac
m=$(awk '/^MemAvailable:/ { print int($2 / 3145728) }' /proc/meminfo 2>/dev/null || echo 0)
if [ "${m:-0}" -ge 1 ] && [ "$m" -lt "$n" ]; then n=$m; fi
if [ "$n" -lt 1 ]; then n=1; fi
echo "$n"
