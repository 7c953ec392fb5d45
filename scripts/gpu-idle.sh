#!/usr/bin/env bash
# Is a transfer after idle slow because of the host's CPU power states?
# (issue 37: the one-transfer rows and the checked ipc row). From what
# `make gpu-build` put in .dev/ (no Go there):
#
#   make gpu-build                                                 # here
#   STAGE_GPU_SRC=0 STAGE_GPU_DST=1 bash scripts/gpu-idle.sh         # there
#
# 1. host.txt: the CPU, its frequency driver and governor, its idle states,
#    the PM QoS and uclamp requests hostwake can make here
#    (idle-before.txt and idle-after.txt: how often each idle state was
#    entered, before and after the tcp step).
# 2. idletcp.txt: raw C loopback TCP, 8 connections, one 1 GiB burst back
#    to back and after 1 s idle, split evenly and shared in chunks, and
#    after idle with hostwake's requests held (-l 0: no deep idle states;
#    -u 1024: top frequency from the first instant).
# 3. shape/: the ranges row after 1 s idle (stagectl bench --pause) with
#    the same requests held by both sidecars (variants lat and uclamp), and
#    back to back, through scripts/gpu-shape.sh.
# 4. ipc/: the ipc row, each checked and back to back, with and without
#    -l 0, through scripts/gpu-ipc.sh (PARTS leaves steps out: "facts tcp
#    shape ipc" by default).
set -u
out=${OUT:-$PWD/gpu-out}; mkdir -p "$out"
parts=${PARTS:-facts tcp shape ipc}
bin=$(cd .dev && pwd)
gcc -O2 -pthread -o "$bin/bench/idletcp" "$bin/bench/idletcp.c" || exit 1
gcc -O2 -o "$bin/bench/hostwake" "$bin/bench/hostwake.c" || exit 1
gcc -O2 -pthread -o "$bin/bench/tcpbw" "$bin/bench/tcpbw.c" || exit 1
hw=$bin/bench/hostwake
idle_states() { # the idle states of cpu0 and how often each was entered, all CPUs summed
  for d in /sys/devices/system/cpu/cpu0/cpuidle/state*; do
    [ -d "$d" ] || continue
    s=${d##*/}; u=0; t=0
    for c in /sys/devices/system/cpu/cpu*/cpuidle/$s; do u=$((u + $(cat "$c/usage"))); t=$((t + $(cat "$c/time"))); done
    printf '%s %-8s latency %5s us, residency %6s us: entered %d times, %d ms in it (all CPUs)\n' \
      "$s" "$(cat "$d/name")" "$(cat "$d/latency")" "$(cat "$d/residency")" "$u" $((t / 1000))
  done
}
case " $parts " in *" facts "*)
  { lscpu; echo; uname -r; nproc
    for f in scaling_driver scaling_governor scaling_available_governors cpuinfo_min_freq cpuinfo_max_freq scaling_min_freq scaling_max_freq energy_performance_preference; do
      printf '%s: %s\n' "$f" "$(cat /sys/devices/system/cpu/cpu0/cpufreq/$f 2>&1)"; done
    for f in /sys/devices/system/cpu/intel_pstate/* /sys/devices/system/cpu/amd_pstate/*; do [ -f "$f" ] && printf '%s: %s\n' "$f" "$(cat "$f")"; done
    printf 'cpuidle driver %s, governor %s\n' "$(cat /sys/devices/system/cpu/cpuidle/current_driver 2>&1)" "$(cat /sys/devices/system/cpu/cpuidle/current_governor_ro 2>&1 || cat /sys/devices/system/cpu/cpuidle/current_governor 2>&1)"
    idle_states
    echo "idle frequencies (MHz, cpus 0-7): $(grep MHz /proc/cpuinfo | head -8 | awk '{printf "%s ", $4}')"
    for k in net.ipv4.tcp_slow_start_after_idle net.ipv4.tcp_rmem net.ipv4.tcp_wmem net.core.rmem_max kernel.sched_util_clamp_min kernel.numa_balancing; do
      printf '%s = %s\n' "$k" "$(sysctl -n $k 2>&1)"; done
    "$hw" -l 0 -u 1024 -- true
  } > "$out/host.txt" 2>&1 ;;
esac
case " $parts " in *" tcp "*)
  { idle_states > "$out/idle-before.txt"
    "$bin/bench/tcpbw" 8
    "$bin/bench/tcpbw" 8 & sleep 0.6; echo "frequencies under tcpbw 8 (MHz, cpus 0-15): $(grep MHz /proc/cpuinfo | head -16 | awk '{printf "%.0f ", $4}')"; wait
    for mode in split shared; do
      "$bin/bench/idletcp" 8 1073741824 0 6 $mode | tail -1
      "$bin/bench/idletcp" 8 1073741824 1000 6 $mode | tail -1
    done
    echo "-l 0:"; "$hw" -l 0 -- "$bin/bench/idletcp" 8 1073741824 1000 6 shared 2>&1 | tail -2
    echo "-u 1024:"; "$hw" -u 1024 -- "$bin/bench/idletcp" 8 1073741824 1000 6 shared 2>&1 | tail -2
    echo "-l 0 -u 1024:"; "$hw" -l 0 -u 1024 -- "$bin/bench/idletcp" 8 1073741824 1000 6 shared 2>&1 | tail -2
    "$bin/bench/tcpbw" 8
    idle_states > "$out/idle-after.txt"
  } > "$out/idletcp.txt" 2>&1 ;;
esac
wrap() { # name, hostwake flags: a staged that runs under hostwake
  mkdir -p "$out/wrap-$1"; local n=$1; shift
  printf '#!/bin/sh\nexec %s %s -- %s "$@"\n' "$hw" "$*" "$bin/staged" > "$out/wrap-$n/staged"
  chmod +x "$out/wrap-$n/staged"; echo "$out/wrap-$n/staged"
}
case " $parts " in *" shape "*)
  STAGED_lat=$(wrap lat -l 0) STAGED_uclamp=$(wrap uclamp -u 1024) OUT=$out/shape VARIANTS="default lat uclamp" \
    PAUSE=1s ROWS=ranges ROUNDS=${ROUNDS:-2} bash scripts/gpu-shape.sh > /dev/null 2>&1
  OUT=$out/shape-b2b ROWS=ranges ROUNDS=1 bash scripts/gpu-shape.sh > /dev/null 2>&1 ;;
esac
case " $parts " in *" ipc "*)
  STAGED_lat=$(wrap lat -l 0) OUT=$out/ipc VARIANTS="default lat" ROUNDS=${ROUNDS:-2} bash scripts/gpu-ipc.sh > /dev/null 2>&1 ;;
esac
for f in host.txt idletcp.txt shape/shape.txt shape-b2b/shape.txt ipc/ipc.txt; do [ -f "$out/$f" ] && { echo "=== $f"; cat "$out/$f"; }; done
