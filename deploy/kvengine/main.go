// Command stage-kvengine is a stand-in inference engine for container and
// Kubernetes smoke tests of the stage sidecar. It plays one side of a
// prefill/decode pair through its own pod's sidecar, with a synthetic paged
// KV cache in a memfd (the hostmem backend's device memory, handed to the
// sidecar with SCM_RIGHTS over the control socket):
//
//	stage-kvengine decode   registers the cache (remote-writable), waits for
//	                        pushes to land, and checks every byte
//	stage-kvengine prefill  registers its cache, waits until the route's peer
//	                        offers the decode cache, and pushes it, one
//	                        transfer per layer
//
// Both sides derive the bytes and the block layout from --seed and the
// cache's shape, so they must be started with the same --layers,
// --layer-bytes, --block and --seed. A finite run (--rounds N) exits 0 once
// N rounds were pushed (prefill) or landed and verified (decode); --rounds 0
// runs until stopped. Any error exits 1.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

const (
	guard  = 4096 // bytes around the layers inside the allocation
	poison = 0xAB // what the decode cache holds before anything lands
)

const usage = `usage: stage-kvengine decode|prefill [flags]

  decode   register a KV cache with the local sidecar and verify what lands in it
  prefill  push a KV cache to the decode side of a route

Run "stage-kvengine decode -h" or "stage-kvengine prefill -h" for flags.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var run func(context.Context, *shape, []string) error
	switch os.Args[1] {
	case "decode":
		run = decode
	case "prefill":
		run = prefill
	case "-h", "-help", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "stage-kvengine: unknown mode %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, &shape{mode: os.Args[1]}, os.Args[2:])
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "stage-kvengine %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// shape is what both sides must agree on, plus the flags they share.
type shape struct {
	mode       string
	socket     string
	name       string
	layers     int
	layerBytes uint64
	rangeBytes uint64
	block      uint64
	seed       uint64
	rounds     int
	timeout    time.Duration
}

func (s *shape) flags(fs *flag.FlagSet, defName string) func() error {
	def := os.Getenv("STAGE_CONTROL_SOCKET")
	if def == "" {
		def = "/run/stage/sock/staged.sock"
	}
	fs.StringVar(&s.socket, "socket", def, "the local sidecar's control socket (default: $STAGE_CONTROL_SOCKET)")
	fs.StringVar(&s.name, "name", defName, "this side's cache name; its regions are NAME/0 .. NAME/LAYERS-1")
	fs.IntVar(&s.layers, "layers", 4, "layers: one region, and one transfer per round, each")
	lb := fs.String("layer-bytes", "4MiB", "bytes per layer")
	rg := fs.String("range", "1MiB", "without --block: move each layer as ranges of this size")
	bl := fs.String("block", "", "move scattered blocks of this size (a seeded permutation per layer) instead of ranges")
	fs.Uint64Var(&s.seed, "seed", 1, "seed of the cache's bytes and of the block permutation")
	fs.IntVar(&s.rounds, "rounds", 1, "rounds to run; 0: until stopped")
	fs.DurationVar(&s.timeout, "timeout", 2*time.Minute, "the longest the whole run may take; 0: no limit")
	return func() error {
		if s.layers <= 0 {
			return fmt.Errorf("--layers %d: want > 0", s.layers)
		}
		if s.rounds < 0 {
			return fmt.Errorf("--rounds %d: want >= 0", s.rounds)
		}
		for _, f := range []struct {
			flag, v string
			dst     *uint64
		}{{"layer-bytes", *lb, &s.layerBytes}, {"range", *rg, &s.rangeBytes}, {"block", *bl, &s.block}} {
			if f.v == "" {
				continue
			}
			n, err := config.ParseByteSize(f.v)
			if err != nil {
				return fmt.Errorf("--%s: %w", f.flag, err)
			}
			*f.dst = uint64(n)
		}
		if s.layerBytes == 0 || s.rangeBytes == 0 {
			return errors.New("--layer-bytes and --range must be > 0")
		}
		if s.block != 0 && s.layerBytes%s.block != 0 {
			return fmt.Errorf("--layer-bytes %s is not a multiple of --block %s", config.ByteSize(s.layerBytes), config.ByteSize(s.block))
		}
		return nil
	}
}

// moves is the block layout both sides compute from the shape.
func (s *shape) moves(c *kvsim.Cache) []kvsim.Move {
	if s.block != 0 {
		return kvsim.Blocks(c, s.block, s.seed)
	}
	return kvsim.Ranges(c, s.rangeBytes)
}

func (s *shape) total() uint64 { return uint64(s.layers) * s.layerBytes }

func (s *shape) logf(format string, args ...any) {
	fmt.Printf("%s: %s\n", s.mode, fmt.Sprintf(format, args...))
}

func (s *shape) deadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.timeout > 0 {
		return context.WithTimeout(ctx, s.timeout)
	}
	return context.WithCancel(ctx)
}

// dial connects to the sidecar, waiting for it to create its socket (the
// engine container may start first).
func (s *shape) dial(ctx context.Context) (*client.Client, error) {
	last := ""
	for {
		cl, err := client.Dial(s.socket)
		if err == nil {
			return cl, nil
		}
		if err.Error() != last { // say why it waits (a wrong uid, a wrong path), once per reason
			last = err.Error()
			s.logf("waiting for the sidecar: %v", err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (gave up: %v)", err, context.Cause(ctx))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func parse(s *shape, args []string, defName string, extra func(*flag.FlagSet)) error {
	fs := flag.NewFlagSet("stage-kvengine "+s.mode, flag.ContinueOnError)
	check := s.flags(fs, defName)
	if extra != nil {
		extra(fs)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	return check()
}

// decode registers the cache, then verifies every round that lands: a round
// is complete when each of its layers' transfers was notified.
func decode(ctx context.Context, s *shape, args []string) error {
	if err := parse(s, args, "decode-kv", nil); err != nil {
		return err
	}
	ctx, cancel := s.deadline(ctx)
	defer cancel()
	cl, err := s.dial(ctx)
	if err != nil {
		return err
	}
	defer cl.Close()
	D, err := kvsim.New(s.name, s.layers, s.layerBytes, guard)
	if err != nil {
		return err
	}
	defer D.Close()
	// What prefill's cache holds: the same shape filled from the same seed.
	want, err := kvsim.New(s.name+"-want", s.layers, s.layerBytes, guard)
	if err != nil {
		return err
	}
	defer want.Close()
	if err := D.Poison(poison); err != nil {
		return err
	}
	if err := want.Fill(s.seed); err != nil {
		return err
	}
	moves := s.moves(want)
	// Subscribe before registering: no push can land unnoticed.
	notes, err := cl.Subscribe(ctx)
	if err != nil {
		return err
	}
	if err := D.Register(ctx, cl, wire.AccessRemoteWrite|wire.AccessRemoteRead); err != nil {
		return err
	}
	s.logf("ready: %d regions %s/0..%d of %s registered on %s; waiting for pushes",
		s.layers, s.name, s.layers-1, config.ByteSize(s.layerBytes), s.socket)

	landed := map[string]int{} // round ("<sender tag prefix>/<round>") -> layers landed
	done := 0
	for s.rounds == 0 || done < s.rounds {
		var n *wire.Notify
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d rounds verified: %w", done, s.rounds, context.Cause(ctx))
		case m, ok := <-notes:
			if !ok {
				return errors.New("the sidecar closed the connection")
			}
			n = m
		}
		if n.Code != wire.CodeOK {
			return fmt.Errorf("transfer %q from %s failed: %s: %s", n.Tag, n.Peer, n.Code, n.Message)
		}
		if n.Dir != wire.Push {
			continue // a pull served from here
		}
		round, _, ok := cutLast(n.Tag)
		if !ok {
			return fmt.Errorf("transfer from %s has tag %q, want PREFIX/ROUND/LAYER", n.Peer, n.Tag)
		}
		landed[round]++
		if landed[round] < s.layers {
			continue
		}
		delete(landed, round)
		// Round 1 lands on poison, so it proves every byte; later rounds
		// write the same bytes again (they may still be landing while this
		// reads) and prove the transfers still complete and stay in bounds.
		if err := kvsim.Verify(want, D, moves, poison); err != nil {
			return fmt.Errorf("round %s from %s: %w", round, n.Peer, err)
		}
		done++
		s.logf("round %s from %s: verified %s in %d layers", round, n.Peer, config.ByteSize(s.total()), s.layers)
	}
	s.logf("verified %d rounds", done)
	return nil
}

// cutLast splits "a/b/c" into "a/b" and "c".
func cutLast(tag string) (string, string, bool) {
	i := strings.LastIndexByte(tag, '/')
	if i <= 0 || i == len(tag)-1 {
		return "", "", false
	}
	return tag[:i], tag[i+1:], true
}

// prefill fills and registers its cache, waits for the route's peer to
// offer the decode cache, and pushes it round after round.
func prefill(ctx context.Context, s *shape, args []string) error {
	var route, remote, peer string
	var interval time.Duration
	if err := parse(s, args, "prefill-kv", func(fs *flag.FlagSet) {
		fs.StringVar(&route, "route", "decode", "route to push on (the sidecar's config names it)")
		fs.StringVar(&peer, "peer", "", "the route's decode to push to (node name or host:port); empty: its only peer")
		fs.StringVar(&remote, "remote", "decode-kv", "the decode side's cache name (its --name)")
		fs.DurationVar(&interval, "interval", 0, "pause between rounds")
	}); err != nil {
		return err
	}
	ctx, cancel := s.deadline(ctx)
	defer cancel()
	cl, err := s.dial(ctx)
	if err != nil {
		return err
	}
	defer cl.Close()
	P, err := kvsim.New(s.name, s.layers, s.layerBytes, guard)
	if err != nil {
		return err
	}
	defer P.Close()
	if err := P.Fill(s.seed); err != nil {
		return err
	}
	if err := P.Register(ctx, cl, wire.AccessLocalRead); err != nil {
		return err
	}
	R := &kvsim.Cache{Name: remote, Layers: s.layers, LayerBytes: s.layerBytes} // names only: it lives at the peer
	catalogOf := route
	if peer != "" {
		catalogOf = route + "@" + peer
	}
	if err := waitCatalog(ctx, cl, catalogOf, R.Regions(), s); err != nil {
		return err
	}
	perLayer := kvsim.ByLayer(P, s.moves(P))
	host, _ := os.Hostname()
	prefix := s.name + "@" + host
	for round := 1; s.rounds == 0 || round <= s.rounds; round++ {
		start := time.Now()
		ids := make([]uint64, 0, s.layers)
		for l, ms := range perLayer {
			tag := fmt.Sprintf("%s/%d/%d", prefix, round, l)
			tr := kvsim.Transfer(route, wire.Push, tag, P, R, ms)
			tr.Peer = peer
			id, err := cl.Submit(ctx, tr)
			if err != nil {
				return fmt.Errorf("round %d: push layer %d: %w", round, l, err)
			}
			ids = append(ids, id)
		}
		for l, id := range ids {
			if _, err := cl.Wait(ctx, id, 0); err != nil {
				return fmt.Errorf("round %d: layer %d: %w", round, l, err)
			}
		}
		el := time.Since(start)
		s.logf("round %d: pushed %s on route %s in %d transfers, %v (%.2f GB/s)", round, config.ByteSize(s.total()), route,
			len(ids), el.Round(time.Millisecond), float64(s.total())/el.Seconds()/1e9)
		if interval > 0 && (s.rounds == 0 || round < s.rounds) {
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(interval):
			}
		}
	}
	s.logf("pushed %d rounds", s.rounds)
	return nil
}

// waitCatalog waits until the route's peer offers every region in names:
// the decode engine has registered its cache.
func waitCatalog(ctx context.Context, cl *client.Client, route string, names []string, s *shape) error {
	var last error
	said := false
	for {
		cat, err := cl.Catalog(ctx, route)
		if err == nil {
			have := map[string]bool{}
			for _, r := range cat {
				have[r.Name] = true
			}
			missing := 0
			for _, n := range names {
				if !have[n] {
					missing++
				}
			}
			if missing == 0 {
				s.logf("route %s offers %s/0..%d", route, strings.TrimSuffix(names[0], "/0"), len(names)-1)
				return nil
			}
			err = fmt.Errorf("the peer offers %d regions, %d of ours missing", len(cat), missing)
		}
		if code := client.CodeOf(err); code == wire.CodeUnknownRoute || errors.Is(err, client.ErrClosed) {
			return err
		}
		if !said || err.Error() != last.Error() {
			s.logf("waiting for route %s: %v", route, err)
			said = true
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("route %s: %w (gave up: %v)", route, last, context.Cause(ctx))
		case <-time.After(500 * time.Millisecond):
		}
	}
}
