package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/wire"
)

func benchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench [ROUTE]",
		Short: "measure transfers on a route: throughput and latency percentiles, beside the raw TCP ceiling",
		Long: `bench acts as the engine on both ends: it registers a buffer with the local
sidecar (--socket) and one with the peer's sidecar (--remote-socket, which must be
on this machine), moves --size bytes per transfer in --block pieces (--pattern
ranges keeps offsets, blocks scatters them in random order), --iters times, and
prints GB/s and per-transfer latency percentiles. --verify checks every byte.

--spawn starts the two sidecars itself (route "bench"); --sweep measures block
sizes from 4KiB to 64MiB (scattered); --raw also measures plain TCP with the same
number of streams in the same run (against an in-process sink with --spawn, or a
"stagectl sink" on the peer's host given by --raw-peer), the ceiling to compare with;
with --sweep, right after each row, and each row is a share of its own.`,
		Args: cobra.RangeArgs(0, 1),
	}
	b := &benchFlags{}
	b.register(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		b.spliceSet, b.spinSet = cmd.Flags().Changed("splice"), cmd.Flags().Changed("spin")
		return b.run(cmd.Context(), socketPath(cmd), args)
	}
	return cmd
}

// run is bench: check the flags, start the sidecars (--spawn), measure,
// report. local is the control socket of the sidecar bench's source
// registers with, unless it starts its own.
func (b *benchFlags) run(ctx context.Context, local string, args []string) error {
	p, err := b.plan(args)
	if err != nil {
		return err
	}
	if err := b.setEnv(); err != nil {
		return err
	}
	remote := b.remote
	var prof *profiler
	if b.spawn {
		s, err := spawnPair(ctx, b, p)
		if err != nil {
			return err
		}
		defer s.stop()
		local, remote, prof = s.local, s.remote, s.prof
	}
	if p.kv {
		rows, err := runKVBench(ctx, os.Stderr, kvBenchOpts{route: p.route, local: local, remote: remote, ldev: p.ldev, rdev: p.rdev,
			from: p.kvFrom, to: p.kvTo, layers: b.kvLayers, tokens: b.kvTokens, heads: b.kvHeads, headSize: b.kvHeadSize,
			iters: b.iters, warmup: b.warmup, checksum: p.checksum, prof: prof, grant: b.kvGrant})
		if err != nil || !b.json {
			return err
		}
		return writeJSON(os.Stdout, rows)
	}
	return b.runRows(ctx, p, benchOpts{route: p.route, local: local, remote: remote, blocks: p.blocksPattern, dir: p.dir,
		ldev: p.ldev, rdev: p.rdev, iters: b.iters, warmup: b.warmup, verify: b.verify || b.verifyEnd, verifyEnd: b.verifyEnd,
		pause: b.pause, prof: prof, checksum: p.checksum, inflight: b.inflight, spin: b.spin, spinSet: b.spinSet, pieces: b.pieces})
}

// setEnv passes --splice and --spin on to the sidecars bench starts: they
// inherit the environment, and STAGE_ variables override their YAML.
func (b *benchFlags) setEnv() error {
	if b.spliceSet {
		if err := os.Setenv("STAGE_STAGING_SPLICE_SEND", strconv.FormatBool(b.splice)); err != nil {
			return fmt.Errorf("--splice: %w", err)
		}
		if err := os.Setenv("STAGE_STAGING_SPLICE_PROBE", "false"); err != nil {
			return fmt.Errorf("--splice: %w", err)
		}
	}
	if b.spawn && b.spinSet {
		if err := os.Setenv("STAGE_STAGING_READ_SPIN", b.spin.String()); err != nil {
			return err
		}
	}
	return nil
}

// spawned is the pair of sidecars bench started (--spawn): the prefill
// side holds the route to the decode side.
type spawned struct {
	local, remote string    // the prefill and decode sidecars' control sockets
	prof          *profiler // nil without --profile
	undo          []func()  // run last first by stop
}

// stop stops the sidecars and removes their folder.
func (s *spawned) stop() {
	for i := len(s.undo) - 1; i >= 0; i-- {
		s.undo[i]()
	}
}

// spawnPair starts the decode sidecar, then the prefill sidecar with the
// route to it, in a new temporary folder; on an error, what it started is
// stopped.
func spawnPair(ctx context.Context, b *benchFlags, p benchPlan) (s *spawned, err error) {
	var extra []string
	if b.profile != "" {
		extra = []string{"--pprof", "127.0.0.1:0"}
	}
	bin, err := stagedPath(b.staged)
	if err != nil {
		return nil, err
	}
	tmp, keep, err := spawnDir(b.logs)
	if err != nil {
		return nil, err
	}
	s = &spawned{}
	if !keep {
		s.undo = []func(){func() { os.RemoveAll(tmp) }}
	}
	defer func() {
		if err != nil {
			s.stop()
		}
	}()
	token := randomToken()
	var decTLS, preTLS string
	if b.tls {
		if decTLS, preTLS, err = throwawayTLS(tmp); err != nil {
			return nil, err
		}
	}
	dec, err := startSidecar(ctx, bin, tmp, "decode", sidecarYAML("decode", tmp+"/decode.sock", p.rdev, b.slotSize, b.slots, "", "", 0, "")+decTLS, token, extra...)
	if err != nil {
		return nil, err
	}
	s.undo = append(s.undo, func() { _ = stopSidecar(dec) })
	pre, err := startSidecar(ctx, bin, tmp, "prefill", sidecarYAML("prefill", tmp+"/prefill.sock", p.ldev, b.slotSize, b.slots, p.route, dec.Peers, b.stripes, b.transport)+preTLS, token, extra...)
	if err != nil {
		return nil, err
	}
	s.undo = append(s.undo, func() { _ = stopSidecar(pre) })
	s.local, s.remote = pre.Socket, dec.Socket
	if b.profile != "" {
		if s.prof, err = newProfiler(b.profile, pre, dec); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// runRows measures a row per block size (o with each row's block and
// size), with raw TCP beside them (--raw), and reports.
func (b *benchFlags) runRows(ctx context.Context, p benchPlan, o benchOpts) error {
	// rawRun measures plain TCP once (nil without --raw).
	var rawRun func() (*RawResult, error)
	if b.raw {
		run, stop, err := newRawRunner(ctx, b.spawn, b.rawPeer, b.stripes, max(p.size, 1<<30), p.span)
		if err != nil {
			return err
		}
		defer stop()
		rawRun = run
	}
	var progress io.Writer // each row as it is measured, in a sweep's table
	if !b.json && len(p.blocks) > 1 {
		progress = os.Stderr
	}
	results, beside, err := benchRows(ctx, o, p.size, p.blocks, rawRun, progress)
	if err != nil {
		return err
	}
	var ceiling *RawResult
	switch {
	case len(beside) > 0:
		ceiling = meanRaw(beside)
	case rawRun != nil:
		if ceiling, err = rawRun(); err != nil {
			return err
		}
	}
	if b.plot != "" {
		host, _ := os.Hostname()
		if err := plotSweep(b.plot, results, ceiling, plotTitle(p.dir, b.stripes, p.size, host, time.Now())); err != nil {
			return fmt.Errorf("--plot %s: %w", b.plot, err)
		}
		fmt.Fprintln(os.Stderr, "plot written to", b.plot)
	}
	return writeBenchReport(os.Stdout, b.json, results, ceiling)
}

// benchRows runs one row per block size, each moving rowSize(size, block)
// per transfer. With several rows and rawRun, raw TCP is measured right
// after each row and each row is compared with its own: loopback TCP
// drifts by 2x within minutes on a shared machine, so one figure for eight
// rows says little. Each row is written to progress as it ends (nil:
// nowhere).
func benchRows(ctx context.Context, o benchOpts, size uint64, blocks []uint64, rawRun func() (*RawResult, error), progress io.Writer) (results []*BenchResult, beside []*RawResult, err error) {
	for _, b := range blocks {
		o.block, o.size = b, rowSize(size, b)
		res, err := runBench(ctx, o)
		if err != nil {
			return nil, nil, fmt.Errorf("block %s: %w", config.ByteSize(b), err)
		}
		if rawRun != nil && len(blocks) > 1 {
			rr, err := rawRun()
			if err != nil {
				return nil, nil, fmt.Errorf("raw TCP after the %s row: %w", config.ByteSize(b), err)
			}
			res.RawBeside = rr.GBps
			beside = append(beside, rr)
		}
		results = append(results, res)
		if progress != nil {
			fmt.Fprintln(progress, res.String())
		}
	}
	return results, beside, nil
}

// plotTitle is the title of --plot's figure.
func plotTitle(d wire.Direction, stripes int, size uint64, host string, now time.Time) string {
	return fmt.Sprintf("stage %s, %d streams, %s per transfer, %s, %s", d, stripes, config.ByteSize(size), host, now.Format("2006-01-02"))
}

// writeBenchReport writes the rows and the raw TCP ceiling (nil: not
// measured) as JSON (a BenchReport), or as printBenchTable's table.
func writeBenchReport(w io.Writer, asJSON bool, results []*BenchResult, ceiling *RawResult) error {
	if asJSON {
		return writeJSON(w, BenchReport{Results: results, Raw: ceiling})
	}
	printBenchTable(w, results, ceiling)
	return nil
}

// writeJSON writes v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// RawResult is plain TCP measured beside stage.
type RawResult struct {
	Streams int     `json:"streams"`
	Span    uint64  `json:"span_bytes"` // buffer each stream cycles over
	GBps    float64 `json:"gb_per_s"`
	// CPUSecPerGB: both ends' CPU (stagectl runs both, in-process) per GB.
	CPUSecPerGB float64 `json:"cpu_s_per_gb"`
	// Runs: how many measurements GBps and CPUSecPerGB are the mean of (a
	// sweep measures one after each row), from MinGBps to MaxGBps.
	Runs    int     `json:"runs"`
	MinGBps float64 `json:"min_gb_per_s"`
	MaxGBps float64 `json:"max_gb_per_s"`
}

// meanRaw is the mean of several raw TCP measurements.
func meanRaw(rs []*RawResult) *RawResult {
	m := *rs[0]
	m.GBps, m.CPUSecPerGB, m.Runs = 0, 0, len(rs)
	for _, r := range rs {
		m.GBps += r.GBps / float64(len(rs))
		m.CPUSecPerGB += r.CPUSecPerGB / float64(len(rs))
		m.MinGBps = min(m.MinGBps, r.GBps)
		m.MaxGBps = max(m.MaxGBps, r.GBps)
	}
	return &m
}

// BenchReport is bench's JSON output.
type BenchReport struct {
	Results []*BenchResult `json:"results"`
	Raw     *RawResult     `json:"raw_tcp,omitempty"`
}

func printBenchTable(w io.Writer, rs []*BenchResult, raw *RawResult) {
	if len(rs) == 1 && raw == nil {
		fmt.Fprintln(w, rs[0].String())
		return
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	hdr := "BLOCK\tPATTERN\tDIR\tGB/s\tp50 us\tp99 us\t"
	if raw != nil {
		hdr += "of raw TCP\t"
	}
	fmt.Fprintln(tw, hdr)
	for _, r := range rs {
		row := fmt.Sprintf("%s\t%s\t%s\t%.3f\t%.0f\t%.0f\t", config.ByteSize(r.Block), r.Pattern, r.Dir, r.GBps, r.P50us, r.P99us)
		if raw != nil {
			base := raw.GBps
			if r.RawBeside > 0 {
				base = r.RawBeside
			}
			row += fmt.Sprintf("%.0f%%\t", 100*r.GBps/base)
		}
		fmt.Fprintln(tw, row)
	}
	_ = tw.Flush()
	if raw != nil {
		if raw.Runs > 1 {
			fmt.Fprintf(w, "raw TCP, %d streams, measured after each row (each row's share is of its own): mean %.3f GB/s, %.3f-%.3f", raw.Streams, raw.GBps, raw.MinGBps, raw.MaxGBps)
		} else {
			fmt.Fprintf(w, "raw TCP, %d streams, same run: %.3f GB/s", raw.Streams, raw.GBps)
		}
		if raw.Span > rawPiece {
			fmt.Fprintf(w, " (4 MiB writes cycling over %s per stream)", config.ByteSize(raw.Span))
		}
		if raw.CPUSecPerGB > 0 {
			fmt.Fprintf(w, ", %.3f CPU s/GB (both ends)", raw.CPUSecPerGB)
		}
		fmt.Fprintln(w)
	}
	for _, r := range rs {
		fmt.Fprintf(w, "%s blocks: sidecars used %.3f CPU s/GB (both: %.3f here, %.3f at the peer)", config.ByteSize(r.Block), r.CPUSecPerGB, r.CPULocal, r.CPURemote)
		if raw != nil && raw.CPUSecPerGB > 0 {
			fmt.Fprintf(w, " = %.2fx raw TCP's", r.CPUSecPerGB/raw.CPUSecPerGB)
		}
		// On hostmem the RSS includes the engine memory the sidecar maps.
		fmt.Fprintf(w, "; larger sidecar RSS %.0f MiB, pinned pool %.0f MiB\n", float64(r.MaxRSS)/(1<<20), float64(r.PoolBytes)/(1<<20))
	}
	if len(rs) > 0 {
		fmt.Fprintf(w, "devices %s; %d transfers of %s each per row, %d in flight; verified: %v\n", rs[0].Devices, rs[0].Iters, config.ByteSize(rs[0].Size), rs[0].Inflight, rs[0].Verified)
	}
}

type benchOpts struct {
	route, local, remote string
	size, block          uint64
	blocks               bool
	dir                  wire.Direction
	ldev, rdev           engineDevice
	iters, warmup        int
	verify               bool
	verifyEnd            bool          // check once after the timed transfers, not after each
	pause                time.Duration // idle before each timed transfer (one at a time)
	prof                 *profiler     // nil: no profiles
	checksum             uint8         // wire.ChecksumRoute, On or Off
	inflight             int           // transfers in flight at once, each on its own buffers
	spin                 config.Spin   // the clients' polling, when spinSet
	spinSet              bool          // --spin given: else the client's default
	pieces               int           // --pieces: client.WithPieces above this many ops; -1: the client's default
}

// BenchResult is the summary of a benchmark.
type BenchResult struct {
	Route    string  `json:"route"`
	Dir      string  `json:"dir"`
	Pattern  string  `json:"pattern"`
	Size     uint64  `json:"bytes_per_transfer"`
	Block    uint64  `json:"block_bytes"`
	Iters    int     `json:"iters"`
	GBps     float64 `json:"gb_per_s"`
	P50us    float64 `json:"p50_us"`
	P90us    float64 `json:"p90_us"`
	P99us    float64 `json:"p99_us"`
	MaxUs    float64 `json:"max_us"`
	Verified bool    `json:"verified"`
	// VerifiedAtEnd: checked once after the timed transfers (--verify-end,
	// or --inflight above 1), not after each.
	VerifiedAtEnd bool `json:"verified_at_end"`
	// PauseMs: idle before each timed transfer (--pause), outside its time.
	PauseMs  float64 `json:"pause_ms,omitempty"`
	Inflight int     `json:"inflight"`
	Devices  string  `json:"devices"`
	// CPU seconds both sidecars used per GB moved, the larger sidecar's
	// resident size at the end, and its pinned pool.
	CPUSecPerGB float64 `json:"cpu_s_per_gb"`
	// The same for each side alone (the bench's own sidecar, which a push
	// sends from, and the remote one) and for bench itself (the engine's
	// client, with its --verify checks); with the transfers' busy time
	// they give GB/s per core.
	CPULocal  float64 `json:"cpu_s_per_gb_local"`
	CPURemote float64 `json:"cpu_s_per_gb_remote"`
	CPUClient float64 `json:"cpu_s_per_gb_client"`
	// CPU microseconds both sidecars used per timed transfer, and the CPU
	// they and bench itself used in the idleWindow after the last one (percent
	// of one core): what polling readers cost, busy and idle.
	CPUusPerXfer   float64 `json:"cpu_us_per_transfer"`
	IdleCPUPct     float64 `json:"idle_cpu_pct"`
	IdleCPUSelfPct float64 `json:"idle_cpu_client_pct"`
	MaxRSS         uint64  `json:"max_rss_bytes"`
	PoolBytes      uint64  `json:"pool_bytes"`
	TotalSecs      float64 `json:"total_s"`
	// RawBeside: raw TCP measured right after this row (sweeps with --raw).
	RawBeside float64 `json:"raw_tcp_beside_gb_per_s,omitempty"`
}

func (r BenchResult) String() string {
	v := "not verified (use --verify)"
	switch {
	case r.Verified && r.VerifiedAtEnd:
		v = "every byte verified after the last transfer"
	case r.Verified:
		v = "every byte verified after each transfer"
	}
	return fmt.Sprintf("%s %s %s (%s): %d x %s in %s blocks: %.3f GB/s; latency p50 %.0f us, p90 %.0f us, p99 %.0f us, max %.0f us; %s; sidecars' CPU %.1f us per transfer, idle after: sidecars %.1f%%, bench %.1f%% of a core",
		r.Route, r.Dir, r.Pattern, r.Devices, r.Iters, config.ByteSize(r.Size), config.ByteSize(r.Block), r.GBps, r.P50us, r.P90us, r.P99us, r.MaxUs, v,
		r.CPUusPerXfer, r.IdleCPUPct, r.IdleCPUSelfPct)
}

// sidecarsCPU returns the CPU seconds both sidecars used so far, the larger
// resident size of the two, and that sidecar's pinned pool size.
func sidecarsCPU(ctx context.Context, cls ...*client.Client) (cpu float64, rss, pool uint64, err error) {
	each, rss, pool, err := eachCPU(ctx, cls...)
	for _, c := range each {
		cpu += c
	}
	return cpu, rss, pool, err
}

// eachCPU is sidecarsCPU with each sidecar's CPU seconds apart, in the
// order of cls.
func eachCPU(ctx context.Context, cls ...*client.Client) (cpu []float64, rss, pool uint64, err error) {
	cpu = make([]float64, len(cls))
	for i, c := range cls {
		st, err := c.Stats(ctx)
		if err != nil {
			return nil, 0, 0, err
		}
		cpu[i] = st.CPUSeconds
		if st.RSSBytes > rss {
			rss, pool = st.RSSBytes, uint64(st.SlotSize)*uint64(st.SendSlots+st.RecvSlots)
		}
	}
	return cpu, rss, pool, nil
}

// selfCPU is this process's user + system CPU seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// spawnDir is where the sidecars bench starts keep their configs, logs and
// sockets: dir (made if missing, kept afterwards: --logs) or a temporary
// directory removed at the end.
func spawnDir(dir string) (path string, keep bool, err error) {
	if dir == "" {
		path, err = os.MkdirTemp("", "stage-bench-")
		return path, false, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", false, fmt.Errorf("--logs %s: %w", dir, err)
	}
	// Sockets and tokens live there: a directory others can enter would
	// make the sidecars refuse their socket directory anyway.
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", false, fmt.Errorf("--logs %s: %w", dir, err)
	}
	return dir, true, nil
}
