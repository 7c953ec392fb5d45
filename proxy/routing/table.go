package routing

import (
	"context"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/wire"
)

// Session is what a route needs of a peer session (the sidecar's
// *session): when it ended and why, closing it when its peer leaves, and
// whom it reached. Pointers to sessions satisfy comparable; the zero value
// is "no session".
type Session interface {
	comparable
	Done() <-chan struct{} // closed when the session ended
	Err() error            // why it ended (once Done is closed)
	Close(err error)
	Peer() (node, remote string) // the peer's node name (handshake) and the ip:port reached
}

// Host is the sidecar as its routes see it.
type Host[S Session] interface {
	// Dial opens a session to addr for r, within the sidecar's limits
	// (limits.max_sessions and max_streams); ctx ends when the peer
	// leaves the route.
	Dial(ctx context.Context, r *Route[S], addr string) (S, error)
	// Room says whether one more session of stripes data streams fits in
	// the limits. It is called with a route's lock held.
	Room(stripes int) error
	// Busy counts what is in flight on ss; a peer is drained only when
	// nothing is.
	Busy(ss S) int
}

// Table is the sidecar's routes by name.
type Table[S Session] struct {
	host Host[S]
	log  *zap.Logger
	wg   *sync.WaitGroup

	mu     sync.Mutex
	ctx    context.Context // the sidecar's, from Start
	routes map[string]*Route[S]
}

// New makes an empty table; nothing is dialed until Start. Every goroutine
// the routes start is counted in wg.
func New[S Session](host Host[S], log *zap.Logger, wg *sync.WaitGroup) *Table[S] {
	return &Table[S]{host: host, log: log, wg: wg, routes: map[string]*Route[S]{}}
}

// Start adds the routes of the config; they live until ctx ends.
func (t *Table[S]) Start(ctx context.Context, routes []config.Route) {
	t.mu.Lock()
	t.ctx = ctx
	t.mu.Unlock()
	for _, rc := range routes {
		t.add(rc)
	}
}

func (t *Table[S]) add(rc config.Route) {
	t.mu.Lock()
	r := t.newRoute(t.ctx, rc)
	t.routes[rc.Name] = r
	t.mu.Unlock()
	r.reconcile(nil)
	t.wg.Add(1)
	go r.janitor()
}

// remove stops a route: its dialers exit and its sessions close, failing
// what is in flight on them.
func (t *Table[S]) remove(name string) {
	t.mu.Lock()
	r := t.routes[name]
	delete(t.routes, name)
	t.mu.Unlock()
	if r != nil {
		r.cancel()
	}
}

// Apply makes the routes those of routes (hot reload): new routes are
// dialed, removed ones closed, routes whose stripes changed are replaced,
// and routes whose other settings changed take them at once: peers added
// are dialed, peers removed are drained (their transfers in flight
// finish), and sessions to peers that stay, with their transfers, are not
// touched. The names come back sorted.
func (t *Table[S]) Apply(routes []config.Route) (added, removed, changed []string) {
	want := map[string]config.Route{}
	for _, rc := range routes {
		want[rc.Name] = rc
	}
	t.mu.Lock()
	have := map[string]*Route[S]{}
	for n, r := range t.routes {
		have[n] = r
	}
	t.mu.Unlock()
	for n := range have {
		if _, ok := want[n]; !ok {
			t.remove(n)
			removed = append(removed, n)
		}
	}
	for n, rc := range want {
		r := have[n]
		switch {
		case r == nil:
			t.add(rc)
			added = append(added, n)
		case r.Conf().Stripes != rc.Stripes:
			t.remove(n)
			t.add(rc)
			changed = append(changed, n)
		case !reflect.DeepEqual(*r.Conf(), rc):
			c := rc
			old := r.Conf()
			r.cfg.Store(&c)
			r.reconcile(old)
			changed = append(changed, n)
		}
	}
	sort.Strings(added)
	sort.Strings(removed)
	sort.Strings(changed)
	return added, removed, changed
}

// Lookup is the route of name, or an unknown-route error naming the
// routes there are.
func (t *Table[S]) Lookup(name string) (*Route[S], error) {
	t.mu.Lock()
	r := t.routes[name]
	t.mu.Unlock()
	if r == nil {
		return nil, status.Errorf(wire.CodeUnknownRoute, "route %q is not configured (have: %s)", name, t.names())
	}
	return r, nil
}

// names lists the routes for error messages.
func (t *Table[S]) names() string {
	var names []string
	for _, r := range t.List() {
		names = append(names, r.name)
	}
	if len(names) == 0 {
		return "none configured"
	}
	return strings.Join(names, ", ")
}

// List is the routes by name.
func (t *Table[S]) List() []*Route[S] {
	t.mu.Lock()
	rs := make([]*Route[S], 0, len(t.routes))
	for _, r := range t.routes {
		rs = append(rs, r)
	}
	t.mu.Unlock()
	slices.SortFunc(rs, func(a, b *Route[S]) int { return strings.Compare(a.name, b.name) })
	return rs
}
