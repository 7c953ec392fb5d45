package acl

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/e2e/e2etest"
	"github.com/stage-kv/stage/internal/sidecars"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/wire"
)

// End to end: real staged processes, one on the acl backend (over an
// emulated libascendcl), moving a paged KV cache to and from a peer,
// started by internal/sidecars as the e2e tests' are.

const guardByte = 0xAB

var (
	stagedOnce sync.Once
	stagedPath string
	stagedDir  string
	stagedErr  error
)

// stagedBinary returns a staged built from this tree (race-enabled when the
// tests are), or $STAGED_BIN on machines without Go.
func stagedBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(e2etest.BinEnv); p != "" {
		return p
	}
	if testing.Short() {
		t.Skip("-short: no staged build")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("go not found (%v) and %s unset: cannot build staged", err, e2etest.BinEnv)
	}
	stagedOnce.Do(func() {
		if stagedDir, stagedErr = os.MkdirTemp("", "stage-acl-e2e-"); stagedErr == nil {
			stagedPath, stagedErr = e2etest.Build(stagedDir, raceBuild)
		}
	})
	if stagedErr != nil {
		t.Fatal(stagedErr)
	}
	return stagedPath
}

func removeStagedBuild() {
	if stagedDir != "" {
		os.RemoveAll(stagedDir)
	}
}

// node is one staged process and a client of it; cmd and peers repeat
// the process's under the names the tests use.
type node struct {
	*sidecars.Process
	t     *testing.T
	name  string
	cmd   *exec.Cmd
	peers string
	cl    *client.Client
	base  wire.Stats
}

type nodeOpts struct {
	route, peer string
	stripes     int
	slots       int
	slot        string
	extra       string // more YAML
	env         []string
}

func startNode(t *testing.T, bin, name string, o nodeOpts) *node {
	t.Helper()
	dir := t.TempDir()
	if o.slots == 0 {
		o.slots = 16
	}
	if o.stripes == 0 {
		o.stripes = 2
	}
	if o.slot == "" {
		o.slot = "1MiB"
	}
	cfg := sidecars.Config{Name: name, Socket: filepath.Join(dir, "s", name+".sock"), SlotSize: o.slot, Slots: o.slots, Extra: o.extra}
	if o.route != "" {
		cfg.Route, cfg.Peer, cfg.Stripes = o.route, o.peer, o.stripes
		cfg.ConnectTimeout, cfg.ProgressTimeout = 2*time.Second, 20*time.Second
	}
	p, err := sidecars.Start(context.Background(), sidecars.Options{Bin: bin, Dir: dir, Name: name, Config: cfg.YAML(),
		Token: "acl-e2e-token", Env: o.env, ReadyTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	n := &node{Process: p, t: t, name: name, cmd: p.Cmd, peers: p.Peers}
	if n.cl, err = client.Dial(p.Socket); err != nil {
		_ = p.Stop(os.Interrupt, 20*time.Second)
		t.Fatal(err)
	}
	t.Cleanup(n.stop)
	return n
}

func (n *node) tail() string { return n.Tail(30) }

// logHas reports whether the node's log holds s.
func (n *node) logHas(s string) bool { return n.LogHas(s) }

// settle records the idle figures once the node's sessions are up.
func (n *node) settle(sessions int) {
	n.t.Helper()
	var err error
	if n.base, err = e2etest.Settle(context.Background(), n.cl, sessions, 10*time.Second); err != nil {
		n.t.Fatalf("%s: %v\n%s", n.name, err, n.tail())
	}
}

// checkIdle fails unless the node is back to its idle figures (see
// e2etest.CheckIdle).
func (n *node) checkIdle() {
	n.t.Helper()
	if err := e2etest.CheckIdle(context.Background(), n.cl, n.base, 10*time.Second); err != nil {
		n.t.Errorf("%s leaked: %v", n.name, err)
	}
}

// stop sends SIGINT and requires a clean exit.
func (n *node) stop() {
	if n.cl != nil {
		n.cl.Close()
		n.cl = nil
	}
	if err := n.Stop(os.Interrupt, 20*time.Second); err != nil {
		n.t.Error(err)
	}
}

// run submits one transfer per layer at once and waits for all of them.
func run(t *testing.T, cl *client.Client, dir wire.Direction, tag string, local, remote *kvsim.Cache, ms []kvsim.Move) {
	t.Helper()
	if _, err := kvsim.RunLayers(context.Background(), cl, "decode", dir, tag, local, remote, ms, 120*time.Second); err != nil {
		t.Fatal(err)
	}
}

// shape is one way of moving a cache: direction and block layout.
type shape struct {
	name  string
	dir   wire.Direction
	moves func(c *kvsim.Cache) []kvsim.Move
}

func shapes(seed uint64) []shape {
	return []shape{
		{"push ranges 1MiB", wire.Push, func(c *kvsim.Cache) []kvsim.Move { return kvsim.Ranges(c, 1<<20) }},
		{"push blocks 16KiB", wire.Push, func(c *kvsim.Cache) []kvsim.Move { return kvsim.Blocks(c, 16<<10, seed) }},
		{"pull ranges 1MiB", wire.Pull, func(c *kvsim.Cache) []kvsim.Move { return kvsim.Ranges(c, 1<<20) }},
		{"pull blocks 16KiB", wire.Pull, func(c *kvsim.Cache) []kvsim.Move { return kvsim.Blocks(c, 16<<10, seed+1) }},
	}
}

// moveCache runs one shape between the acl node (pre, the route's sender,
// whose caches npu makes) and its peer (dec, whose caches peer makes), and
// verifies it byte-exact. The source lives on the side that sends.
func moveCache(t *testing.T, pre, dec *node, sh shape, npu, peer func(name string) *kvsim.Cache) time.Duration {
	t.Helper()
	ctx := context.Background()
	var S, D *kvsim.Cache
	var sn, dn *node
	if sh.dir == wire.Push {
		S, D, sn, dn = npu("src"), peer("dst"), pre, dec
	} else {
		S, D, sn, dn = peer("src"), npu("dst"), dec, pre
	}
	defer func() {
		for _, c := range []*kvsim.Cache{S, D} {
			if err := c.Close(); err != nil {
				t.Errorf("free %s: %v", c.Name, err)
			}
		}
	}()
	if err := S.Fill(uint64(time.Now().UnixNano())); err != nil {
		t.Fatal(err)
	}
	if err := D.Poison(guardByte); err != nil {
		t.Fatal(err)
	}
	if err := S.Register(ctx, sn.cl, wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	if err := D.Register(ctx, dn.cl, wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	// Importers close before the exporter frees: unregister first.
	defer func() {
		if err := S.Unregister(ctx, sn.cl); err != nil {
			t.Error(err)
		}
		if err := D.Unregister(ctx, dn.cl); err != nil {
			t.Error(err)
		}
	}()
	ms := sh.moves(S)
	start := time.Now()
	if sh.dir == wire.Push {
		run(t, pre.cl, wire.Push, "acl", S, D, ms)
	} else {
		run(t, pre.cl, wire.Pull, "acl", D, S, ms)
	}
	el := time.Since(start)
	if err := kvsim.Verify(S, D, ms, guardByte); err != nil {
		t.Fatal(err)
	}
	return el
}

// TestE2EStagedACL: an acl staged (emulated libascendcl, through
// device.acl.library) and a hostmem staged move 64 MiB each way as 1 MiB
// ranges and as 16 KiB blocks, byte-exact, in batch and in pack mode. The
// acl side's cache is fake-ACL device memory allocated by this process and
// registered by export key (whitelisted for the acl staged's pid) at an odd
// offset inside a larger allocation; the peer's is a memfd.
func TestE2EStagedACL(t *testing.T) {
	bin := stagedBinary(t)
	so := buildFake(t)
	const layers, layerBytes, guard = 4, 16 << 20, 12288
	for _, mode := range []string{"batch", "pack"} {
		t.Run(mode, func(t *testing.T) {
			dec := startNode(t, bin, "decode", nodeOpts{})
			pre := startNode(t, bin, "ascend", nodeOpts{route: "decode", peer: dec.peers, stripes: 4,
				extra: "device:\n  kind: acl\n  ordinal: 0\n", env: stagedEnv(so, CopyMode(mode))})
			pre.settle(1)
			dec.settle(1)
			if want := fmt.Sprintf("acl: acl:0 (%s): copy mode %s (requested)", so, mode); !pre.logHas(want) {
				t.Fatalf("the acl sidecar's log lacks %q:\n%s", want, pre.tail())
			}
			l := openFakeSO(t, so, true)
			d := openDev(t, l, Config{})
			pid := int32(pre.cmd.Process.Pid)
			npu := func(name string) *kvsim.Cache {
				m, err := newACLMemory(d, 2*guard+layers*layerBytes, pid)
				if err != nil {
					t.Fatal(err)
				}
				c, err := kvsim.NewOn(m, "npu-"+name, layers, layerBytes, guard)
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			host := func(name string) *kvsim.Cache {
				c, err := kvsim.New("host-"+name, layers, layerBytes, guard)
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			for _, sh := range shapes(31) {
				t.Run(sh.name, func(t *testing.T) {
					el := moveCache(t, pre, dec, sh, npu, host)
					t.Logf("%s acl(%s) <-> hostmem: %d MiB in %v (%.2f GB/s), byte-exact", sh.name, mode, layers*layerBytes>>20,
						el.Round(time.Millisecond), float64(layers*layerBytes)/el.Seconds()/1e9)
				})
			}
			pre.checkIdle()
			dec.checkIdle()
		})
	}
}
