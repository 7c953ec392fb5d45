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
	f := cmd.Flags()
	spawn := f.Bool("spawn", false, "start two local sidecars (route \"bench\") and measure between them")
	stripes := f.Int("stripes", 4, "with --spawn: data streams between the sidecars; with --raw: TCP streams")
	staged := f.String("staged", "", "with --spawn: path of the staged binary (default: beside stagectl)")
	devFlag := f.String("device", "hostmem", "where the local engine memory (and with --spawn, the local sidecar's device) lives: hostmem or cuda:N")
	rdevFlag := f.String("remote-device", "", "the same for the remote side (default: as --device)")
	slotSize := f.String("slot-size", "4MiB", "with --spawn: staging slot size")
	slotsFlag := f.Int("slots", 32, "with --spawn: staging slots per sidecar")
	remote := f.String("remote-socket", "", "control socket of the peer's sidecar (required without --spawn)")
	size := f.String("size", "256MiB", "bytes per transfer")
	block := f.String("block", "1MiB", "block size")
	pattern := f.String("pattern", "ranges", "ranges | blocks")
	dir := f.String("dir", "push", "push | pull")
	iters := f.Int("iters", 5, "transfers to time")
	warmup := f.Int("warmup", 1, "untimed transfers first")
	verify := f.Bool("verify", false, "check every byte after each transfer")
	verifyEnd := f.Bool("verify-end", false, "poison the destination before the timed transfers and check every byte after the last: transfers run back to back, as an engine's do, instead of with a check between each (what --inflight above 1 always does)")
	asJSON := f.Bool("json", false, "print the results as JSON")
	sweep := f.Bool("sweep", false, "measure block sizes 4KiB..64MiB (scattered blocks)")
	raw := f.Bool("raw", false, "also measure raw TCP with the same streams (the ceiling)")
	rawSpan := f.String("raw-span", "4MiB", "with --raw: each raw stream cycles 4 MiB writes (and reads) over a buffer this large; 4MiB keeps it in the CPU caches, a larger one measures TCP from cold memory as stage's staging slots are")
	rawPeer := f.String("raw-peer", "", "with --raw and no --spawn: address of a `stagectl sink` on the peer's host")
	plot := f.String("plot", "", "with --sweep: draw throughput against block size, with the raw TCP line, into this file: PNG, or SVG, PDF, EPS, JPEG or TIFF by its extension (.svg, .pdf, ...)")
	checksum := f.String("checksum", "route", "CRC32C per chunk: on, off, or route (as the route says)")
	transport := f.String("transport", "tcp", "with --spawn: the route's transport; tcp measures the staging path, auto/ipc/shm the same-node paths")
	inflight := f.Int("inflight", 1, "transfers in flight at once, each between its own pair of buffers, as an engine pushing layer after layer keeps them; above 1, latency is per transfer and --verify checks each pair once after the timed transfers")
	useTLS := f.Bool("tls", false, "with --spawn: the sidecars talk mutual TLS (security.tls), with a throwaway CA and certificates made for the run")
	spinFor := f.Duration("spin", 0, "poll instead of sleeping for up to this long after each message: in bench's client (client.WithSpin) and, with --spawn, in the sidecars (staging.read_spin); 0 never polls; not given: the defaults (100us on machines of 8+ CPUs, else 0)")
	splice := f.Bool("splice", true, "with --spawn: whether the sidecars send chunk payloads with vmsplice+splice (staging.splice_send). Unset: their default, splice where it applies if a start-up probe finds it faster than writev on this machine (staging.splice_probe); --splice forces it on without the probe, --splice=false off; see docs/OPERATIONS.md, \"Splice send\"")
	kvArg := f.String("kv", "", "move a synthetic KV cache from layout preset FROM (local) to TO (remote), as FROM[/BLOCK]:TO[/BLOCK] (e.g. ascend/128:vllm-hnd/16), beside the same-layout KV transfer and its byte ops, in the same run")
	kvTokens := f.Uint32("kv-tokens", 4096, "with --kv: tokens per transfer")
	kvLayers := f.Int("kv-layers", 8, "with --kv: layers per transfer")
	kvHeads := f.Uint32("kv-heads", 8, "with --kv: kv heads (both sides hold all)")
	kvHeadSize := f.Uint32("kv-head-size", 128, "with --kv: head size in elements")
	kvGrant := f.Bool("kv-grant", false, "with --kv: also time the same-layout transfer into a guarded cache, with a Grant before and a RevokeGrant after each (the vLLM connector's cost per request; docs/PROTOCOL.md 9.20)")
	profDir := f.String("profile", "", "with --spawn: write CPU profiles and execution traces of both sidecars over each row's timed transfers into this folder (go tool pprof, go tool trace)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		sz, err := config.ParseByteSize(*size)
		if err != nil {
			return fmt.Errorf("--size: %w", err)
		}
		bl, err := config.ParseByteSize(*block)
		if err != nil {
			return fmt.Errorf("--block: %w", err)
		}
		var d wire.Direction
		switch *dir {
		case "push":
			d = wire.Push
		case "pull":
			d = wire.Pull
		default:
			return fmt.Errorf("--dir must be push or pull (got %q)", *dir)
		}
		var sum uint8
		switch *checksum {
		case "route":
			sum = wire.ChecksumRoute
		case "on":
			sum = wire.ChecksumOn
		case "off":
			sum = wire.ChecksumOff
		default:
			return fmt.Errorf("--checksum must be on, off or route (got %q)", *checksum)
		}
		if *inflight < 1 || *inflight > 64 {
			return fmt.Errorf("--inflight must be 1 to 64 (got %d)", *inflight)
		}
		if *pattern != "ranges" && *pattern != "blocks" {
			return fmt.Errorf("--pattern must be ranges or blocks (got %q)", *pattern)
		}
		ldev, err := parseEngineDevice(*devFlag)
		if err != nil {
			return fmt.Errorf("--device: %w", err)
		}
		rdev := ldev
		if *rdevFlag != "" {
			if rdev, err = parseEngineDevice(*rdevFlag); err != nil {
				return fmt.Errorf("--remote-device: %w", err)
			}
		}
		route := "bench"
		if len(args) == 1 {
			route = args[0]
		}
		local := socketPath(cmd)
		var prof *profiler
		if *useTLS && !*spawn {
			return fmt.Errorf("--tls needs --spawn (it configures the sidecars bench starts; for your own, set security.tls in their configs)")
		}
		if *profDir != "" && !*spawn {
			return fmt.Errorf("--profile needs --spawn (it profiles the sidecars bench starts)")
		}
		if *spinFor < 0 || *spinFor > config.MaxReadSpin {
			return fmt.Errorf("--spin must be 0..%s (got %s)", config.MaxReadSpin, *spinFor)
		}
		spliceSet := f.Changed("splice")
		if spliceSet && !*spawn {
			return fmt.Errorf("--splice needs --spawn (it configures the sidecars bench starts; for your own, set staging.splice_send in their configs)")
		}
		if spliceSet {
			// Both spawned sidecars inherit it (STAGE_ overrides the YAML).
			if err := os.Setenv("STAGE_STAGING_SPLICE_SEND", strconv.FormatBool(*splice)); err != nil {
				return fmt.Errorf("--splice: %w", err)
			}
			if err := os.Setenv("STAGE_STAGING_SPLICE_PROBE", "false"); err != nil {
				return fmt.Errorf("--splice: %w", err)
			}
		}
		spinSet := f.Changed("spin")
		if *spawn && spinSet {
			// The spawned sidecars inherit it (STAGE_ overrides the YAML).
			if err := os.Setenv("STAGE_STAGING_READ_SPIN", spinFor.String()); err != nil {
				return err
			}
		}
		if *spawn {
			var extra []string
			if *profDir != "" {
				extra = []string{"--pprof", "127.0.0.1:0"}
			}
			bin, err := stagedPath(*staged)
			if err != nil {
				return err
			}
			tmp, err := os.MkdirTemp("", "stage-bench-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(tmp)
			token := randomToken()
			var decTLS, preTLS string
			if *useTLS {
				if decTLS, preTLS, err = throwawayTLS(tmp); err != nil {
					return err
				}
			}
			dec, err := startSidecar(ctx, bin, tmp, "decode", sidecarYAML("decode", tmp+"/decode.sock", rdev, *slotSize, *slotsFlag, "", "", 0, "")+decTLS, token, extra...)
			if err != nil {
				return err
			}
			defer stopSidecar(dec)
			pre, err := startSidecar(ctx, bin, tmp, "prefill", sidecarYAML("prefill", tmp+"/prefill.sock", ldev, *slotSize, *slotsFlag, route, dec.Peers, *stripes, *transport)+preTLS, token, extra...)
			if err != nil {
				return err
			}
			defer stopSidecar(pre)
			local, *remote = pre.Socket, dec.Socket
			if *profDir != "" {
				if prof, err = newProfiler(*profDir, pre, dec); err != nil {
					return err
				}
			}
		} else if len(args) == 0 {
			return fmt.Errorf("name a ROUTE, or pass --spawn")
		}
		if *remote == "" {
			return fmt.Errorf("--remote-socket is required: bench registers the destination buffer with the peer's sidecar (or pass --spawn)")
		}
		if *kvArg != "" {
			from, to, err := parseKVArg(*kvArg)
			if err != nil {
				return err
			}
			if *kvTokens == 0 || *kvLayers < 1 || *kvHeads == 0 || *kvHeadSize == 0 {
				return fmt.Errorf("--kv-tokens, --kv-layers, --kv-heads and --kv-head-size must be positive")
			}
			rows, err := runKVBench(ctx, os.Stderr, kvBenchOpts{route: route, local: local, remote: *remote, ldev: ldev, rdev: rdev,
				from: from, to: to, layers: *kvLayers, tokens: *kvTokens, heads: *kvHeads, headSize: *kvHeadSize,
				iters: *iters, warmup: *warmup, checksum: sum, prof: prof, grant: *kvGrant})
			if err != nil {
				return err
			}
			if *asJSON {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(rows)
			}
			return nil
		}
		blocks := []uint64{uint64(bl)}
		blocksPattern := *pattern == "blocks"
		if *sweep {
			blocks, blocksPattern = nil, true
			for b := uint64(4 << 10); b <= 64<<20; b *= 4 {
				blocks = append(blocks, b)
			}
		}
		span, err := config.ParseByteSize(*rawSpan)
		if err != nil || span < rawPiece || span%rawPiece != 0 {
			return fmt.Errorf("--raw-span: want a multiple of 4MiB (got %q)", *rawSpan)
		}
		// rawRun measures plain TCP once (nil without --raw).
		var rawRun func() (*RawResult, error)
		if *raw {
			run, stop, err := newRawRunner(ctx, *spawn, *rawPeer, *stripes, max(uint64(sz), 1<<30), int(span))
			if err != nil {
				return err
			}
			defer stop()
			rawRun = run
		}
		// A sweep measures raw TCP right after each row, and each row is
		// compared with its own: loopback TCP drifts by 2x within minutes
		// on a shared machine, so one figure for eight rows says little.
		var beside []*RawResult
		var results []*BenchResult
		for _, b := range blocks {
			total := uint64(sz)
			if total < b {
				total = b
			}
			total -= total % b
			res, err := runBench(ctx, benchOpts{route: route, local: local, remote: *remote, size: total,
				block: b, blocks: blocksPattern, dir: d, ldev: ldev, rdev: rdev, iters: *iters, warmup: *warmup, verify: *verify || *verifyEnd, verifyEnd: *verifyEnd, prof: prof, checksum: sum, inflight: *inflight, spin: *spinFor, spinSet: spinSet})
			if err != nil {
				return fmt.Errorf("block %s: %w", config.ByteSize(b), err)
			}
			if rawRun != nil && len(blocks) > 1 {
				rr, err := rawRun()
				if err != nil {
					return fmt.Errorf("raw TCP after the %s row: %w", config.ByteSize(b), err)
				}
				res.RawBeside = rr.GBps
				beside = append(beside, rr)
			}
			results = append(results, res)
			if !*asJSON && len(blocks) > 1 {
				fmt.Fprintln(os.Stderr, res.String())
			}
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
		if *plot != "" {
			host, _ := os.Hostname()
			title := fmt.Sprintf("stage %s, %d streams, %s per transfer, %s, %s", d, *stripes, config.ByteSize(sz), host, time.Now().Format("2006-01-02"))
			if err := plotSweep(*plot, results, ceiling, title); err != nil {
				return fmt.Errorf("--plot %s: %w", *plot, err)
			}
			fmt.Fprintln(os.Stderr, "plot written to", *plot)
		}
		if *asJSON {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(BenchReport{Results: results, Raw: ceiling})
		}
		printBenchTable(os.Stdout, results, ceiling)
		return nil
	}
	return cmd
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
		fmt.Fprintf(w, "%s blocks: sidecars used %.3f CPU s/GB (both)", config.ByteSize(r.Block), r.CPUSecPerGB)
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
	prof                 *profiler     // nil: no profiles
	checksum             uint8         // wire.ChecksumRoute, On or Off
	inflight             int           // transfers in flight at once, each on its own buffers
	spin                 time.Duration // client.WithSpin, when spinSet
	spinSet              bool          // --spin given: else the client's default
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
	VerifiedAtEnd bool   `json:"verified_at_end"`
	Inflight      int    `json:"inflight"`
	Devices       string `json:"devices"`
	// CPU seconds both sidecars used per GB moved, the larger sidecar's
	// resident size at the end, and its pinned pool.
	CPUSecPerGB float64 `json:"cpu_s_per_gb"`
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
	for _, c := range cls {
		st, err := c.Stats(ctx)
		if err != nil {
			return 0, 0, 0, err
		}
		cpu += st.CPUSeconds
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
