package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

func benchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench ROUTE",
		Short: "measure transfers on a route: throughput and latency percentiles",
		Long: `bench acts as the engine on both ends: it registers a buffer with the local
sidecar (--socket) and one with the peer's sidecar (--remote-socket, which must be
on this machine), moves --size bytes per transfer in --block pieces (--pattern
ranges keeps offsets, blocks scatters them in random order), --iters times, and
prints GB/s and per-transfer latency percentiles. --verify checks every byte.`,
		Args: cobra.RangeArgs(0, 1),
	}
	f := cmd.Flags()
	spawn := f.Bool("spawn", false, "start two local sidecars on emulated devices (route \"bench\") and measure between them")
	stripes := f.Int("stripes", 4, "with --spawn: data streams between the sidecars")
	staged := f.String("staged", "", "with --spawn: path of the staged binary (default: beside stagectl)")
	remote := f.String("remote-socket", "", "control socket of the peer's sidecar (required)")
	size := f.String("size", "256MiB", "bytes per transfer")
	block := f.String("block", "1MiB", "block size")
	pattern := f.String("pattern", "ranges", "ranges | blocks")
	dir := f.String("dir", "push", "push | pull")
	iters := f.Int("iters", 5, "transfers to time")
	warmup := f.Int("warmup", 1, "untimed transfers first")
	verify := f.Bool("verify", false, "check every byte after each transfer")
	asJSON := f.Bool("json", false, "print the summary as JSON")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		sz, err := config.ParseByteSize(*size)
		if err != nil {
			return fmt.Errorf("--size: %w", err)
		}
		bl, err := config.ParseByteSize(*block)
		if err != nil {
			return fmt.Errorf("--block: %w", err)
		}
		route := "bench"
		if len(args) == 1 {
			route = args[0]
		}
		local := socketPath(cmd)
		if *spawn {
			bin, err := stagedPath(*staged)
			if err != nil {
				return err
			}
			dir, err := os.MkdirTemp("", "stage-bench-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			slots := max(16, int(2*8*uint64(bl)/(4<<20)))
			token := randomToken()
			dec, err := startSidecar(cmd.Context(), bin, dir, "decode", sidecarYAML("decode", dir+"/decode.sock", "4MiB", slots, "", "", 0), token)
			if err != nil {
				return err
			}
			defer dec.stop()
			pre, err := startSidecar(cmd.Context(), bin, dir, "prefill", sidecarYAML("prefill", dir+"/prefill.sock", "4MiB", slots, route, dec.peers, *stripes), token)
			if err != nil {
				return err
			}
			defer pre.stop()
			local, *remote = pre.socket, dec.socket
		} else if len(args) == 0 {
			return fmt.Errorf("name a ROUTE, or pass --spawn")
		}
		if *remote == "" {
			return fmt.Errorf("--remote-socket is required: bench registers the destination buffer with the peer's sidecar (or pass --spawn)")
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
		if *pattern != "ranges" && *pattern != "blocks" {
			return fmt.Errorf("--pattern must be ranges or blocks (got %q)", *pattern)
		}
		if uint64(bl) == 0 || uint64(sz)%uint64(bl) != 0 {
			return fmt.Errorf("--size %s must be a multiple of --block %s", *size, *block)
		}
		res, err := runBench(cmd.Context(), benchOpts{route: route, local: local, remote: *remote, size: uint64(sz),
			block: uint64(bl), blocks: *pattern == "blocks", dir: d, iters: *iters, warmup: *warmup, verify: *verify})
		if err != nil {
			return err
		}
		if *asJSON {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(res)
		}
		fmt.Println(res.String())
		return nil
	}
	return cmd
}

type benchOpts struct {
	route, local, remote string
	size, block          uint64
	blocks               bool
	dir                  wire.Direction
	iters, warmup        int
	verify               bool
}

// BenchResult is the summary of a benchmark.
type BenchResult struct {
	Route     string  `json:"route"`
	Dir       string  `json:"dir"`
	Pattern   string  `json:"pattern"`
	Size      uint64  `json:"bytes_per_transfer"`
	Block     uint64  `json:"block_bytes"`
	Iters     int     `json:"iters"`
	GBps      float64 `json:"gb_per_s"`
	P50us     float64 `json:"p50_us"`
	P90us     float64 `json:"p90_us"`
	P99us     float64 `json:"p99_us"`
	MaxUs     float64 `json:"max_us"`
	Verified  bool    `json:"verified"`
	TotalSecs float64 `json:"total_s"`
}

func (r BenchResult) String() string {
	v := "not verified (use --verify)"
	if r.Verified {
		v = "every byte verified"
	}
	return fmt.Sprintf("%s %s %s: %d x %s in %s blocks: %.3f GB/s; latency p50 %.0f us, p90 %.0f us, p99 %.0f us, max %.0f us; %s",
		r.Route, r.Dir, r.Pattern, r.Iters, config.ByteSize(r.Size), config.ByteSize(r.Block), r.GBps, r.P50us, r.P90us, r.P99us, r.MaxUs, v)
}

func runBench(ctx context.Context, o benchOpts) (*BenchResult, error) {
	lc, err := client.Dial(o.local)
	if err != nil {
		return nil, err
	}
	defer lc.Close()
	rc, err := client.Dial(o.remote)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	tag := fmt.Sprintf("bench-%d", time.Now().UnixNano()%1e6)
	L, err := kvsim.New(tag+"-local", 1, o.size, 4096)
	if err != nil {
		return nil, err
	}
	defer L.Close()
	R, err := kvsim.New(tag+"-remote", 1, o.size, 4096)
	if err != nil {
		return nil, err
	}
	defer R.Close()
	if err := L.Register(ctx, lc, wire.AccessLocalRead|wire.AccessLocalWrite); err != nil {
		return nil, err
	}
	defer L.Unregister(context.Background(), lc)
	if err := R.Register(ctx, rc, wire.AccessRemoteRead|wire.AccessRemoteWrite); err != nil {
		return nil, err
	}
	defer R.Unregister(context.Background(), rc)
	src, dst := L, R
	if o.dir == wire.Pull {
		src, dst = R, L
	}
	src.Fill(uint64(time.Now().UnixNano()))
	var ms []kvsim.Move
	if o.blocks {
		ms = kvsim.Blocks(src, o.block, 3)
	} else {
		ms = kvsim.Ranges(src, o.block)
	}
	t := kvsim.Transfer(o.route, o.dir, tag, L, R, ms)
	progress := o.iters >= 3 && isTerminal(os.Stderr)
	lat := make([]time.Duration, 0, o.iters)
	var busy time.Duration
	for i := 0; i < o.warmup+o.iters; i++ {
		if o.verify {
			dst.Poison(0xAB)
		}
		start := time.Now()
		if _, err := lc.Do(ctx, t); err != nil {
			return nil, fmt.Errorf("transfer %d: %w", i, err)
		}
		el := time.Since(start)
		if o.verify {
			if err := kvsim.Verify(src, dst, ms, 0xAB); err != nil {
				return nil, fmt.Errorf("transfer %d: %w", i, err)
			}
		}
		if i >= o.warmup {
			lat = append(lat, el)
			busy += el
			if progress {
				done := len(lat)
				bar := strings.Repeat("=", done*30/o.iters) + strings.Repeat(" ", 30-done*30/o.iters)
				fmt.Fprintf(os.Stderr, "\rbench [%s] %d/%d  %.3f GB/s", bar, done, o.iters, float64(uint64(done)*o.size)/busy.Seconds()/1e9)
			}
		}
	}
	if progress {
		fmt.Fprintln(os.Stderr)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		i := int(p*float64(len(lat))+0.5) - 1
		i = max(0, min(i, len(lat)-1))
		return float64(lat[i].Nanoseconds()) / 1e3
	}
	pat := "ranges"
	if o.blocks {
		pat = "blocks"
	}
	return &BenchResult{Route: o.route, Dir: o.dir.String(), Pattern: pat, Size: o.size, Block: o.block, Iters: len(lat),
		GBps: float64(uint64(len(lat))*o.size) / busy.Seconds() / 1e9, P50us: pct(0.5), P90us: pct(0.9), P99us: pct(0.99),
		MaxUs: pct(1), Verified: o.verify, TotalSecs: busy.Seconds()}, nil
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
