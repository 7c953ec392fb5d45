package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// The demo times each phase twice, as `stagectl bench` does (--warmup 1):
// the first pass through freshly registered memory pays for the page
// faults of the sidecars' new mappings of it and of their unused staging
// slots. Measured on a 2-core VM: a 256 MiB push of 1 MiB ranges took
// 2.1-2.5 s cold and 0.19 s warm, a pull 2.6-4.4 s cold and 0.32 s warm;
// a write fault on a memfd page mapped afresh costs ~5 us there. An engine
// registers its cache once and transfers many times, so the second pass
// is the figure to show; the first is printed beside it.
//
// demoMeaning says so in the output, with what the figure is of.
func demoMeaning(o demoOpts) string {
	devices := "emulated devices (hostmem)"
	if o.pdev.kind != "hostmem" || o.ddev.kind != "hostmem" {
		devices = fmt.Sprintf("devices %s -> %s", o.pdev, o.ddev)
	}
	path := "over loopback TCP"
	if o.transport != "tcp" {
		path = fmt.Sprintf("on route transport %q (the same-node paths where they apply)", o.transport)
	}
	return "GB/s is each phase's second pass (FIRST: the same transfers into freshly registered memory, paying its page faults once);\n" +
		devices + " on one host " + path + ": stage's own cost, not a network's."
}

// demoPass submits one transfer per layer at once, waits for all, and
// waits for the decode side's notification of each (tags PREFIX-LAYER).
func demoPass(ctx context.Context, pc *client.Client, notes <-chan *wire.Notify, prefix string, dir wire.Direction,
	local, remote *kvsim.Cache, ms []kvsim.Move) (el time.Duration, xfers, notified int, err error) {
	start := time.Now()
	if xfers, err = kvsim.RunLayers(ctx, pc, "decode", dir, prefix, local, remote, ms, 0); err != nil {
		return 0, 0, 0, err
	}
	el = time.Since(start)
	notified, err = collectNotes(notes, xfers, prefix, dir)
	return el, xfers, notified, err
}

// demoPhase runs a pass, poisons dst, runs it again and verifies it: the
// second pass is the one whose bytes the check sees, so a pass that moved
// nothing cannot hide behind the first.
func demoPhase(ctx context.Context, pc *client.Client, notes <-chan *wire.Notify, name string, dir wire.Direction,
	local, remote, src, dst *kvsim.Cache, ms []kvsim.Move) (phaseResult, error) {
	r := phaseResult{name: name, bytes: kvsim.Bytes(ms)}
	prefix := fmt.Sprintf("demo-%d", time.Now().UnixNano())
	var err error
	if r.first, _, _, err = demoPass(ctx, pc, notes, prefix+"-first", dir, local, remote, ms); err != nil {
		return r, fmt.Errorf("%s, first pass: %w", name, err)
	}
	if err := dst.Poison(0xAB); err != nil {
		return r, err
	}
	if r.elapsed, r.xfers, r.notes, err = demoPass(ctx, pc, notes, prefix+"-timed", dir, local, remote, ms); err != nil {
		return r, fmt.Errorf("%s: %w", name, err)
	}
	if err := kvsim.Verify(src, dst, ms, 0xAB); err != nil {
		return r, fmt.Errorf("after %s: %w", name, err)
	}
	return r, nil
}

// cachePhases pushes P to D as ranges and as scattered blocks, then pulls
// the blocks back into B, undoing the permutation: B must equal P.
func cachePhases(ctx context.Context, pc *client.Client, notes <-chan *wire.Notify, o demoOpts, P, D, B *kvsim.Cache) ([]phaseResult, error) {
	var results []phaseResult
	ranges := kvsim.Ranges(P, o.rng)
	r, err := demoPhase(ctx, pc, notes, "push ranges "+config.ByteSize(o.rng).String(), wire.Push, P, D, P, D, ranges)
	if err != nil {
		return nil, err
	}
	results = append(results, r)
	blocks := kvsim.Blocks(P, o.block, 42)
	if r, err = demoPhase(ctx, pc, notes, "push blocks "+config.ByteSize(o.block).String(), wire.Push, P, D, P, D, blocks); err != nil {
		return nil, err
	}
	results = append(results, r)
	back := make([]kvsim.Move, len(blocks))
	for i, m := range blocks {
		back[i] = kvsim.Move{Layer: m.Layer, SrcOff: m.DstOff, DstOff: m.SrcOff, Len: m.Len}
	}
	if r, err = demoPhase(ctx, pc, notes, "pull blocks "+config.ByteSize(o.block).String(), wire.Pull, B, D, D, B, back); err != nil {
		return nil, err
	}
	results = append(results, r)
	if err := kvsim.Verify(P, B, kvsim.Ranges(P, o.layerBytes), 0xAB); err != nil {
		return nil, fmt.Errorf("pulled-back cache differs from the original: %w", err)
	}
	return results, nil
}

// printPhases prints the results table and what its figures mean.
func printPhases(w io.Writer, o demoOpts, results []phaseResult) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PHASE\tBYTES\tTRANSFERS\tFIRST\tTIME\tGB/s\tNOTIFIED\tVERIFIED")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%v\t%v\t%.2f\t%d/%d\tyes\n", r.name, config.ByteSize(r.bytes), r.xfers,
			r.first.Round(time.Millisecond), r.elapsed.Round(time.Millisecond), float64(r.bytes)/r.elapsed.Seconds()/1e9, r.notes, r.xfers)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, demoMeaning(o))
}
