package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// rusageCPU is who's user plus system CPU seconds (RUSAGE_THREAD: the
// calling thread, which must be locked to its goroutine).
func rusageCPU(who int) (float64, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(who, &ru); err != nil {
		return 0, fmt.Errorf("getrusage(%d): %w", who, err)
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9, nil
}

// userHZ is the unit of /proc/stat's times (USER_HZ, 100 on Linux).
const userHZ = 100

// hostStat is the host's busy and softirq CPU time so far, in ticks of
// USER_HZ, from the first line of /proc/stat. Ticks stay integers until
// a difference is taken: two float sums of seconds can round apart, and a
// run then reads softirq a hair above busy.
type hostStat struct{ busy, softirq uint64 }

// since is the CPU seconds, busy and softirq, from an earlier reading to
// this one; a counter that went back (it should not) reads 0.
func (h hostStat) since(before hostStat) (busy, softirq float64) {
	d := func(now, then uint64) float64 {
		if now < then {
			return 0
		}
		return float64(now-then) / userHZ
	}
	return d(h.busy, before.busy), d(h.softirq, before.softirq)
}

func readHostStat() (hostStat, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return hostStat{}, fmt.Errorf("host CPU: %w", err)
	}
	return parseHostStat(string(b))
}

// parseHostStat reads the "cpu" line: user nice system idle iowait irq
// softirq ...; busy is user, nice, system, irq and softirq (not steal:
// another guest's time).
func parseHostStat(text string) (hostStat, error) {
	line, _, _ := strings.Cut(text, "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return hostStat{}, fmt.Errorf("host CPU: /proc/stat starts %q, not a cpu line of 7+ counters", line)
	}
	var v [7]uint64
	for i := range v {
		n, err := strconv.ParseUint(f[i+1], 10, 64)
		if err != nil {
			return hostStat{}, fmt.Errorf("host CPU: /proc/stat counter %d %q: %w", i+1, f[i+1], err)
		}
		v[i] = n
	}
	var busy uint64
	for _, i := range []int{0, 1, 2, 5, 6} {
		if busy+v[i] < busy {
			return hostStat{}, fmt.Errorf("host CPU: /proc/stat's busy counters overflow 64 bits: %q", line)
		}
		busy += v[i]
	}
	return hostStat{busy: busy, softirq: v[6]}, nil
}
