// Command tcpmodes measures loopback TCP the way stage's data streams use
// it, so that stage's data path can be set beside Go's and C's raw sockets
// with the same memory footprint (issue 37, items 3 and 5).
//
// The older probes (shared/bench tcpbw.c and gotcp.go) write one hot 4 MiB
// buffer again and again, which stays in the CPU's cache. Stage's streams
// write from a window of distinct pinned slots: 32 slots of 4 MiB
// (staging.window 32 of staging.slots 64, slot_size 4MiB, the defaults and
// what scripts/gpu-targets.sh runs) over 8 streams, 16 MiB per stream. Here
// each connection's sender cycles over --ring bytes of its own mmap'd,
// touched memory in --chunk pieces (defaults 16 MiB and 4 MiB: stage's
// figures); --ring equal to --chunk is the old probes' hot buffer.
//
// Senders write by --mode:
//
//	net      net.Conn Write through Go's netpoller (writev of head and
//	         payload where --head > 0)
//	writev   rawconn's blocking writev, as stage's writev writer
//	splice   rawconn.WriteSplice (vmsplice into a pipe, splice into the
//	         socket), as stage's splice writer. Stage holds a slot until the
//	         peer acked its chunk before writing into it again; this probe
//	         never writes into its send ring once touched, so sending the
//	         same pages again while the kernel still holds them is harmless.
//	zerocopy sendmsg(MSG_ZEROCOPY) on an SO_ZEROCOPY socket; completions are
//	         reaped from the socket's error queue, and a ring slot is sent
//	         again only after its last send completed (the rule a real user
//	         must keep). On loopback the kernel copies anyway when it hands
//	         the bytes to the receiving socket: the completions say so
//	         (SO_EE_CODE_ZEROCOPY_COPIED), counted in zc_copied.
//
// Receivers always recv(MSG_WAITALL) chunk by chunk into a ring of their
// own (rawconn.Conn.ReadFull). Every sender and receiver goroutine is locked
// to its thread and reads getrusage(RUSAGE_THREAD) around its loop, so CPU
// seconds per GB come out per side. Stage's own writers and readers are not
// locked, and a locked goroutine that parks (net mode, on a full socket)
// costs a hand-off to its own thread when it wakes: --lock=false runs them
// unlocked, with the per-side figures -1 and the per-core figure from the
// process's CPU instead. Two wider figures come with them: the
// process's CPU (RUSAGE_SELF; in net mode the netpoller's wake-ups run on
// other threads and show only there) and the whole host's busy CPU from
// /proc/stat, softirq apart. Loopback's receive path runs as softirq on
// the sending CPU; a kernel built with CONFIG_IRQ_TIME_ACCOUNTING leaves
// that time out of every task's figures, so compare with host_softirq_s.
//
// bench/tcpmodes/tcpmodes.c is the same probe in C (modes write, splice,
// zerocopy) with the same flags and output; scripts/gpu-tcpmodes.sh runs
// both over a matrix of modes, rings, socket buffers and connections.
//
// Usage:
//
//	tcpmodes [--conns 8] [--total 4GiB] [--chunk 4MiB] [--ring 16MiB]
//	         [--sndbuf 0] [--head 0] [--mode writev] [--lock=true] [--spin 0]
//	         [--json]
//
// --total is per connection; sizes take B, KiB, MiB, GiB (or K, M, G).
// --sndbuf > 0 sets SO_SNDBUF and SO_RCVBUF on both ends (stage's
// staging.socket_buffer), which turns off autotuning. --head > 0 writes a
// head of that many bytes before each chunk (stage's chunk head is 56 B
// for one segment) and the receiver reads it apart, as stage's does.
// --spin (Go only) makes receivers poll for that long before each blocking
// recv, as stage's data-stream readers do (staging.read_spin: 100us on 8+
// CPUs by default); 0, the default, is the C probe's plain blocking recv.
// Output: one line per run, or one JSON object with --json.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// options are the flags of one run.
type options struct {
	conns  int
	total  int64 // bytes per connection
	chunk  int
	ring   int
	sndbuf int
	head   int
	mode   string
	lock   bool // each goroutine on its own thread, CPU counted per thread
	spin   time.Duration
}

// modes are the sender paths this probe knows.
var modes = []string{"net", "writev", "splice", "zerocopy"}

func main() {
	if err := cli(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "tcpmodes:", err)
		os.Exit(1)
	}
}

// cli parses args, runs once and prints the result to w.
func cli(args []string, w io.Writer) error {
	o, asJSON, err := parseFlags(args)
	if err != nil {
		return err
	}
	res, err := run(o)
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(w).Encode(res)
	}
	_, err = fmt.Fprintln(w, res.String())
	return err
}

// parseFlags turns the command line into checked options.
func parseFlags(args []string) (options, bool, error) {
	fs := flag.NewFlagSet("tcpmodes", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o := options{}
	total, chunk, ring, sndbuf := "4GiB", "4MiB", "16MiB", "0"
	fs.IntVar(&o.conns, "conns", 8, "connections (sender and receiver pairs)")
	fs.Func("total", "bytes per connection (default 4GiB)", func(s string) error { total = s; return nil })
	fs.Func("chunk", "bytes per write (default 4MiB, stage's slot_size)", func(s string) error { chunk = s; return nil })
	fs.Func("ring", "distinct memory per connection and side (default 16MiB)", func(s string) error { ring = s; return nil })
	fs.Func("sndbuf", "SO_SNDBUF and SO_RCVBUF on both ends; 0: autotuning", func(s string) error { sndbuf = s; return nil })
	fs.IntVar(&o.head, "head", 0, "bytes of head written before each chunk")
	fs.StringVar(&o.mode, "mode", "writev", "sender path: "+strings.Join(modes, ", "))
	fs.DurationVar(&o.spin, "spin", 0, "receivers poll this long before each blocking recv (rawconn.SetSpin, stage's staging.read_spin)")
	fs.BoolVar(&o.lock, "lock", true, "lock each sender and receiver goroutine to its thread (per-side CPU)")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if err := fs.Parse(args); err != nil {
		return o, false, fmt.Errorf("%w (flags: --conns --total --chunk --ring --sndbuf --head --mode --lock --spin --json)", err)
	}
	if fs.NArg() > 0 {
		return o, false, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	for _, f := range []struct {
		name string
		s    string
		max  int64
		dst  func(int64)
	}{
		{"total", total, 1 << 50, func(v int64) { o.total = v }},
		{"chunk", chunk, 1 << 30, func(v int64) { o.chunk = int(v) }},
		{"ring", ring, 1 << 36, func(v int64) { o.ring = int(v) }},
		{"sndbuf", sndbuf, 1 << 30, func(v int64) { o.sndbuf = int(v) }},
	} {
		v, err := parseSize(f.s)
		if err != nil {
			return o, false, fmt.Errorf("--%s: %w", f.name, err)
		}
		if v > f.max {
			return o, false, fmt.Errorf("--%s %d is past %d", f.name, v, f.max)
		}
		f.dst(v)
	}
	return o, *asJSON, o.check()
}

// check says what is wrong with o, if anything.
func (o options) check() error {
	switch {
	case o.conns < 1 || o.conns > 256:
		return fmt.Errorf("--conns %d: want 1..256", o.conns)
	case o.chunk < 1:
		return errors.New("--chunk must be at least 1 B")
	case o.total < 1:
		return errors.New("--total must be at least 1 B")
	case o.ring < o.chunk || o.ring%o.chunk != 0:
		return fmt.Errorf("--ring %d must be a whole number (>= 1) of --chunk %d", o.ring, o.chunk)
	case o.spin < 0 || o.spin > time.Second:
		return fmt.Errorf("--spin %v: want 0..1s", o.spin)
	case o.sndbuf < 0:
		return errors.New("--sndbuf must not be negative")
	case o.head < 0 || o.head > 1<<20:
		return fmt.Errorf("--head %d: want 0..1MiB", o.head)
	}
	for _, m := range modes {
		if o.mode == m {
			return nil
		}
	}
	return fmt.Errorf("--mode %q: want one of %s", o.mode, strings.Join(modes, ", "))
}

// parseSize reads "4MiB", "64K", "1048576": binary units, B optional.
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSuffix(t, u.suffix), u.mult
			break
		}
	}
	v, err := strconv.ParseInt(strings.TrimSpace(t), 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("size %q: want a number of bytes, optionally with B, KiB, MiB or GiB", s)
	}
	if v > (1<<62)/mult {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return v * mult, nil
}
