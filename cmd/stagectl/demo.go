package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

func demoCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "start a prefill and a decode sidecar on emulated devices and move a KV cache between them",
		Long: `demo starts two staged processes (prefill and decode) with emulated devices,
registers a synthetic paged KV cache on each (every layer a region at a non-zero
offset inside one shared allocation), pushes it from prefill to decode as large
ranges and as scattered blocks, pulls it back, verifies every byte, and prints
throughput and both sidecars' stats.`,
		Args: cobra.NoArgs,
	}
	f := cmd.Flags()
	staged := f.String("staged", "", "path of the staged binary (default: beside stagectl)")
	size := f.String("size", "256MiB", "KV cache size per side")
	layers := f.Int("layers", 8, "layers (one region and one transfer each)")
	block := f.String("block", "16KiB", "block size of the scattered phase")
	rng := f.String("range", "1MiB", "range size of the range phase")
	stripes := f.Int("stripes", 4, "data streams between the sidecars")
	slot := f.String("slot-size", "4MiB", "staging slot size")
	slots := f.Int("slots", 32, "staging slots per sidecar")
	keep := f.Bool("keep", false, "keep the temporary directory with configs and logs")
	hold := f.Bool("hold", false, "after the demo, keep both sidecars running (and print their sockets) until interrupted")
	devFlag := f.String("device", "hostmem", "prefill side's device: hostmem or cuda:N")
	rdevFlag := f.String("remote-device", "", "decode side's device (default: as --device)")
	transport := f.String("transport", "tcp", "the route's transport: tcp shows the staging path (pinned slots, TCP); auto, ipc or shm the same-node paths")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		sz, err := config.ParseByteSize(*size)
		if err != nil {
			return fmt.Errorf("--size: %w", err)
		}
		bl, err := config.ParseByteSize(*block)
		if err != nil {
			return fmt.Errorf("--block: %w", err)
		}
		rg, err := config.ParseByteSize(*rng)
		if err != nil {
			return fmt.Errorf("--range: %w", err)
		}
		layerBytes := uint64(sz) / uint64(*layers)
		layerBytes -= layerBytes % uint64(bl)
		if layerBytes == 0 {
			return fmt.Errorf("--size %s is too small for %d layers of %s blocks", *size, *layers, *block)
		}
		pdev, err := parseEngineDevice(*devFlag)
		if err != nil {
			return fmt.Errorf("--device: %w", err)
		}
		ddev := pdev
		if *rdevFlag != "" {
			if ddev, err = parseEngineDevice(*rdevFlag); err != nil {
				return fmt.Errorf("--remote-device: %w", err)
			}
		}
		bin, err := stagedPath(*staged)
		if err != nil {
			return err
		}
		dir, err := os.MkdirTemp("", "stage-demo-")
		if err != nil {
			return err
		}
		if !*keep {
			defer os.RemoveAll(dir)
		} else {
			fmt.Println("configs and logs in", dir)
		}
		return runDemo(cmd.Context(), demoOpts{bin: bin, dir: dir, layers: *layers, layerBytes: layerBytes, block: uint64(bl),
			rng: uint64(rg), stripes: *stripes, slot: *slot, slots: *slots, pdev: pdev, ddev: ddev, hold: *hold, transport: *transport})
	}
	return cmd
}

type demoOpts struct {
	bin, dir          string
	layers            int
	layerBytes, block uint64
	rng               uint64
	stripes           int
	slot              string
	slots             int
	pdev, ddev        engineDevice
	hold              bool
	transport         string
}

// phaseResult is one demo phase: first is its untimed-for-GB/s first pass
// (into freshly registered memory), elapsed the pass the rate is of.
type phaseResult struct {
	name    string
	bytes   uint64
	xfers   int
	first   time.Duration
	elapsed time.Duration
	notes   int
}

func runDemo(ctx context.Context, o demoOpts) (err error) {
	token := randomToken()
	fmt.Printf("starting two sidecars (%s -> %s) in %s\n", o.pdev, o.ddev, o.dir)
	dec, err := startSidecar(ctx, o.bin, o.dir, "decode", sidecarYAML("decode", filepath.Join(o.dir, "decode.sock"), o.ddev, o.slot, o.slots, "", "", 0, ""), token)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stopSidecar(dec)) }()
	pre, err := startSidecar(ctx, o.bin, o.dir, "prefill", sidecarYAML("prefill", filepath.Join(o.dir, "prefill.sock"), o.pdev, o.slot, o.slots, "decode", dec.Peers, o.stripes, o.transport), token)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stopSidecar(pre)) }()
	pc, err := client.Dial(pre.Socket)
	if err != nil {
		return err
	}
	defer pc.Close()
	dc, err := client.Dial(dec.Socket)
	if err != nil {
		return err
	}
	defer dc.Close()
	notes, err := dc.Subscribe(ctx)
	if err != nil {
		return err
	}

	P, D, B, closeCaches, err := newDemoCaches(ctx, o, pc, dc)
	if err != nil {
		return err
	}
	defer closeCaches()
	total := uint64(o.layers) * o.layerBytes
	fmt.Printf("KV cache: %d layers x %s = %s per side (prefill on %s, decode on %s); each layer a region at offset >= %d inside one allocation\n",
		o.layers, config.ByteSize(o.layerBytes), config.ByteSize(total), o.pdev, o.ddev, demoGuard)

	results, err := cachePhases(ctx, pc, notes, o, P, D, B)
	if err != nil {
		return err
	}

	// Phase 4: a KV cache between two engines' layouts.
	r, err := kvPhase(ctx, pc, dc, notes, o.pdev, o.ddev)
	if err != nil {
		return err
	}
	results = append(results, r)

	printPhases(os.Stdout, o, results)
	if err := printDemoStats(ctx, pc, dc); err != nil {
		return err
	}
	for _, c := range []struct {
		cache *kvsim.Cache
		cl    *client.Client
	}{{P, pc}, {B, pc}, {D, dc}} {
		if err := c.cache.Unregister(ctx, c.cl); err != nil {
			return err
		}
	}
	fmt.Println("\ndemo ok: every byte verified")
	if o.hold {
		fmt.Printf("\nsidecars still running (Ctrl-C stops them):\n  prefill %s (route \"decode\")\n  decode  %s\n", pre.Socket, dec.Socket)
		fmt.Printf("for example:\n  python3 python/examples/kv_connector.py --prefill %s --decode %s\n", pre.Socket, dec.Socket)
		fmt.Printf("  ./bin/stagectl --socket %s stats --watch 1s\n", pre.Socket)
		<-ctx.Done()
	}
	return nil
}

// printDemoStats prints both sidecars' stats, as stagectl stats does.
func printDemoStats(ctx context.Context, pc, dc *client.Client) error {
	for _, sc := range []struct {
		name string
		c    *client.Client
	}{{"prefill", pc}, {"decode", dc}} {
		st, err := sc.c.Stats(ctx)
		if err != nil {
			return err
		}
		fmt.Printf("\n== stagectl stats (%s) ==\n", sc.name)
		printStats(os.Stdout, st, nil, 0)
	}
	return nil
}

// collectNotes waits for n successful notifications whose tags start with prefix.
func collectNotes(notes <-chan *wire.Notify, n int, prefix string, dir wire.Direction) (int, error) {
	got := 0
	timeout := time.After(10 * time.Second)
	for got < n {
		select {
		case nt, ok := <-notes:
			if !ok {
				return got, errors.New("notification stream closed")
			}
			if len(nt.Tag) < len(prefix) || nt.Tag[:len(prefix)] != prefix || nt.Dir != dir {
				continue
			}
			if nt.Code != wire.CodeOK {
				return got, fmt.Errorf("transfer %q failed on the receiver: %s", nt.Tag, nt.Message)
			}
			got++
		case <-timeout:
			return got, fmt.Errorf("only %d of %d notifications arrived within 10s", got, n)
		}
	}
	return got, nil
}

// demoGuard is the gap before and between the demo caches' layers, where
// a stray write shows.
const demoGuard = 4096

// newDemoCaches makes the demo's byte caches, each registered with the
// access its role needs: P the prefill's (filled, read locally), D the
// decode's (poisoned, written and read by the peer) and B the prefill's
// for the pull back (poisoned, written locally). closeAll frees them.
func newDemoCaches(ctx context.Context, o demoOpts, pc, dc *client.Client) (P, D, B *kvsim.Cache, closeAll func(), err error) {
	var made []*kvsim.Cache
	closeAll = func() {
		for _, c := range made {
			_ = c.Close()
		}
	}
	mk := func(dev engineDevice, name string, cl *client.Client, access wire.Access, fill bool) (*kvsim.Cache, error) {
		k, err := newCache(dev, name, o.layers, o.layerBytes, demoGuard)
		if err != nil {
			return nil, err
		}
		made = append(made, k)
		if fill {
			err = k.Fill(1)
		} else {
			err = k.Poison(0xAB)
		}
		if err != nil {
			return nil, err
		}
		return k, k.Register(ctx, cl, access)
	}
	if P, err = mk(o.pdev, "prefill-kv", pc, wire.AccessLocalRead, true); err != nil {
		closeAll()
		return nil, nil, nil, nil, err
	}
	if D, err = mk(o.ddev, "decode-kv", dc, wire.AccessRemoteWrite|wire.AccessRemoteRead, false); err != nil {
		closeAll()
		return nil, nil, nil, nil, err
	}
	if B, err = mk(o.pdev, "back-kv", pc, wire.AccessLocalWrite, false); err != nil {
		closeAll()
		return nil, nil, nil, nil, err
	}
	return P, D, B, closeAll, nil
}
