package netns

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// toxi is one toxiproxy proxy run in the test process (in the hub
// namespace): sidecars dial its address instead of their peer's.
//
// toxiproxy (v2.12.0) can hang for good removing a toxic from links that
// a reset just closed, holding the lock every new connection needs: the
// proxy is then dead; adding one can wait for good on a link stuck
// writing to a peer that does not read. add and remove give up after
// removeWithin and replace the proxy with a fresh one on the same
// address, carrying the toxics that are on; the hung goroutines are left
// behind (and ignored by the leak check).
type toxi struct {
	t                      *testing.T
	name, listen, upstream string

	mu       sync.Mutex
	proxy    *toxiproxy.Proxy
	on       map[string]toxic // in place, for a replacement
	replaced int
}

const removeWithin = 5 * time.Second

// newToxi proxies listen (host:0 picks a port) to upstream until the test ends.
func newToxi(t *testing.T, name, listen, upstream string) *toxi {
	t.Helper()
	zerolog.SetGlobalLevel(zerolog.Disabled) // its toxics log through the global logger
	x := &toxi{t: t, name: name, upstream: upstream, on: map[string]toxic{}}
	p, err := x.start(listen)
	if err != nil {
		t.Fatal(err)
	}
	x.proxy, x.listen = p, p.Listen
	t.Cleanup(func() { stopWithin(x.current()) })
	return x
}

func (x *toxi) start(listen string) (*toxiproxy.Proxy, error) {
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, x.name, listen, x.upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("toxiproxy %s -> %s: %w", listen, x.upstream, err)
	}
	return p, nil
}

// stopWithin stops p, not waiting more than removeWithin (Stop hangs on
// a proxy whose lock a hung removal holds).
func stopWithin(p *toxiproxy.Proxy) {
	done := make(chan struct{})
	go func() { p.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(removeWithin):
	}
}

func (x *toxi) current() *toxiproxy.Proxy {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.proxy
}

// addr is where the proxy listens.
func (x *toxi) addr() string { return x.listen }

// replacements says how often a hung proxy was replaced.
func (x *toxi) replacements() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.replaced
}

// replace swaps a hung proxy for a fresh one on the same address, with
// the toxics that are on.
func (x *toxi) replace(old *toxiproxy.Proxy) error {
	stopWithin(old) // its listener closes even when Stop hangs
	var p *toxiproxy.Proxy
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if p, err = x.start(x.listen); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replace hung toxiproxy: %w", err)
		}
	}
	x.mu.Lock()
	x.proxy = p
	x.replaced++
	var keep []toxic
	for _, tx := range x.on {
		keep = append(keep, tx)
	}
	x.mu.Unlock()
	for _, tx := range keep {
		if err := addTo(p, tx); err != nil {
			return err
		}
	}
	x.t.Logf("toxiproxy %s hung changing its toxics; replaced it", x.name)
	return nil
}

// toxic describes one toxic; see toxiproxy's README for the attributes of
// each type (latency, bandwidth, slicer, reset_peer, timeout, ...).
type toxic struct {
	Name     string         `json:"name"`
	Type     string         `json:"type"`
	Stream   string         `json:"stream"` // upstream (to the peer) or downstream
	Toxicity float32        `json:"toxicity"`
	Attrs    map[string]int `json:"attributes"`
}

// add installs a toxic on the proxy's links, existing and new.
func (x *toxi) add(tx toxic) error {
	if tx.Toxicity == 0 {
		tx.Toxicity = 1
	}
	if tx.Stream == "" {
		tx.Stream = "upstream"
	}
	x.mu.Lock()
	p := x.proxy
	x.on[tx.Name] = tx
	x.mu.Unlock()
	// Adding interrupts every link's toxic chain, which waits for a link
	// stuck writing to a peer that does not read: bounded like remove,
	// or a fault loop could wait forever (a soak once never ended).
	done := make(chan error, 1)
	go func() { done <- addTo(p, tx) }()
	select {
	case err := <-done:
		return err
	case <-time.After(removeWithin):
		return x.replace(p) // the fresh proxy gets every toxic in x.on, tx too
	}
}

func addTo(p *toxiproxy.Proxy, tx toxic) error {
	js, err := json.Marshal(tx)
	if err != nil {
		return fmt.Errorf("encode toxic %s: %w", tx.Name, err)
	}
	if _, err := p.Toxics.AddToxicJson(bytes.NewReader(js)); err != nil {
		return fmt.Errorf("add toxic %s: %w", js, err)
	}
	return nil
}

// remove takes a toxic off (replacing the proxy if toxiproxy hangs).
func (x *toxi) remove(name string) error {
	x.mu.Lock()
	p := x.proxy
	delete(x.on, name)
	x.mu.Unlock()
	done := make(chan error, 1)
	go func() { done <- p.Toxics.RemoveToxic(context.Background(), name) }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("remove toxic %s: %w", name, err)
		}
		return nil
	case <-time.After(removeWithin):
		return x.replace(p)
	}
}

// nft loads a ruleset into namespace ns.
func nft(ns, rules string) error {
	c := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	c.Stdin = strings.NewReader(rules)
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("nft in %s: %w: %s\n%s", ns, err, strings.TrimSpace(string(out)), rules)
	}
	return nil
}

// dropPorts drops, in ns, every TCP segment from or to local port p (a
// blackhole of those connections: no RST, no FIN, nothing) until lifted.
// table names the rule set, so that several can coexist.
func dropPorts(ns, table string, ports ...int) error {
	var set []string
	for _, p := range ports {
		set = append(set, strconv.Itoa(p))
	}
	s := strings.Join(set, ", ")
	return nft(ns, fmt.Sprintf(`table inet %s {
	chain out {
		type filter hook output priority 0; policy accept;
		tcp sport { %s } drop
	}
	chain in {
		type filter hook input priority 0; policy accept;
		tcp dport { %s } drop
	}
}
`, table, s, s))
}

// lift deletes a rule set made by dropPorts.
func lift(ns, table string) error {
	return nft(ns, "delete table inet "+table+"\n")
}

// conn is an established TCP connection seen by ss.
type conn struct {
	local, peer string
	localPort   int
	bytesAcked  uint64
}

// conns lists ns's established TCP connections to peer (host:port).
func conns(ns, peer string) ([]conn, error) {
	out, err := exec.Command("ip", "netns", "exec", ns, "ss", "-Htin", "state", "established", "dst", peer).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("ss in %s: %w: %s", ns, err, out)
	}
	var cs []conn
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if line[0] != ' ' && line[0] != '\t' {
			if len(f) < 4 {
				return nil, fmt.Errorf("ss in %s: unexpected line %q", ns, line)
			}
			c := conn{local: f[2], peer: f[3]}
			i := strings.LastIndexByte(c.local, ':')
			if c.localPort, err = strconv.Atoi(c.local[i+1:]); err != nil {
				return nil, fmt.Errorf("ss in %s: local address %q: %w", ns, c.local, err)
			}
			cs = append(cs, c)
			continue
		}
		for _, kv := range f {
			if v, ok := strings.CutPrefix(kv, "bytes_acked:"); ok && len(cs) > 0 {
				if cs[len(cs)-1].bytesAcked, err = strconv.ParseUint(v, 10, 64); err != nil {
					return nil, fmt.Errorf("ss in %s: %q: %w", ns, kv, err)
				}
			}
		}
	}
	return cs, nil
}
