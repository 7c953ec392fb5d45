package main

import (
	"fmt"
	"strings"
	"time"
)

// Result is one run's figures; tcpmodes.c prints the same JSON keys.
// GB is 1e9 bytes. CPU figures are seconds; -1 where not measured.
type Result struct {
	Impl      string  `json:"impl"` // "go" or "c"
	Mode      string  `json:"mode"`
	Conns     int     `json:"conns"`
	Total     int64   `json:"total"` // bytes per connection
	Chunk     int64   `json:"chunk"`
	Ring      int64   `json:"ring"`
	Sndbuf    int64   `json:"sndbuf"`
	Head      int64   `json:"head"`
	Locked    bool    `json:"locked"`   // per-thread CPU measured (C: always)
	SpinUS    int64   `json:"spin_us"`  // receivers' polling window (C: 0)
	Sent      int64   `json:"sent"`     // payload bytes all senders wrote
	Received  int64   `json:"received"` // payload bytes all receivers read
	Seconds   float64 `json:"seconds"`  // start to the last receiver's end
	GBps      float64 `json:"gbps"`
	SendCPU   float64 `json:"send_cpu_s"` // senders' threads, summed
	RecvCPU   float64 `json:"recv_cpu_s"` // receivers' threads, summed
	ProcCPU   float64 `json:"proc_cpu_s"` // the whole process
	HostCPU   float64 `json:"host_cpu_s"` // every CPU of the host, busy
	HostSoft  float64 `json:"host_softirq_s"`
	SendPerGB float64 `json:"send_cpu_s_per_gb"`
	RecvPerGB float64 `json:"recv_cpu_s_per_gb"`
	ProcPerGB float64 `json:"proc_cpu_s_per_gb"`
	HostPerGB float64 `json:"host_cpu_s_per_gb"`
	PerCore   float64 `json:"gbps_per_core"` // GB per CPU second of senders and receivers (unlocked: of the process)
	ZCSends   int64   `json:"zc_sends"`      // zerocopy: completions reaped (sendmsg calls)
	ZCCopied  int64   `json:"zc_copied"`     // of those, the ones the kernel copied
}

// raw is what a run measured, before figures are derived.
type raw struct {
	sent, received     int64
	seconds            float64
	sendCPU, recvCPU   float64
	procCPU            float64
	hostCPU, hostSoft  float64
	zcSends, zcCopied  int64
	conns              int
	total, chunk, ring int64
	sndbuf, head       int64
	mode               string
	locked             bool
	spin               time.Duration
}

// summarize derives the per-GB and per-core figures from r.
func summarize(r raw) Result {
	gb := float64(r.received) / 1e9
	per := func(cpu float64) float64 {
		if gb <= 0 || cpu < 0 {
			return -1
		}
		return cpu / gb
	}
	res := Result{
		Impl: "go", Mode: r.mode, Conns: r.conns, Total: r.total, Chunk: r.chunk, Ring: r.ring,
		Sndbuf: r.sndbuf, Head: r.head, Locked: r.locked, SpinUS: r.spin.Microseconds(), Sent: r.sent, Received: r.received, Seconds: r.seconds,
		SendCPU: r.sendCPU, RecvCPU: r.recvCPU, ProcCPU: r.procCPU, HostCPU: r.hostCPU, HostSoft: r.hostSoft,
		SendPerGB: per(r.sendCPU), RecvPerGB: per(r.recvCPU), ProcPerGB: per(r.procCPU), HostPerGB: per(r.hostCPU),
		PerCore: -1, ZCSends: r.zcSends, ZCCopied: r.zcCopied,
	}
	if r.seconds > 0 {
		res.GBps = gb / r.seconds
	}
	busy := r.sendCPU + r.recvCPU
	if r.sendCPU < 0 || r.recvCPU < 0 {
		busy = r.procCPU
	}
	if busy > 0 {
		res.PerCore = gb / busy
	}
	return res
}

// String is the human-readable line of r.
func (r Result) String() string {
	var b strings.Builder
	mode := r.Mode
	if !r.Locked {
		mode += "/unlocked"
	}
	if r.SpinUS > 0 {
		mode += fmt.Sprintf("/spin%dus", r.SpinUS)
	}
	fmt.Fprintf(&b, "%-2s %-8s conns %d chunk %s ring %s sndbuf %s head %d: %.2f GB in %.3f s = %6.2f GB/s",
		r.Impl, mode, r.Conns, size(r.Chunk), size(r.Ring), size(r.Sndbuf), r.Head,
		float64(r.Received)/1e9, r.Seconds, r.GBps)
	fmt.Fprintf(&b, "; cpu s/GB send %.4f recv %.4f proc %.4f host %.4f (softirq %.2f s); %.2f GB/s per busy core",
		r.SendPerGB, r.RecvPerGB, r.ProcPerGB, r.HostPerGB, r.HostSoft, r.PerCore)
	if r.Mode == "zerocopy" {
		fmt.Fprintf(&b, "; zerocopy completions %d, copied %d", r.ZCSends, r.ZCCopied)
	}
	return b.String()
}

// size prints n in the largest binary unit that divides it.
func size(n int64) string {
	switch {
	case n == 0:
		return "0"
	case n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
