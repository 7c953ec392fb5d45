package client

// The sidecar's requests, each a call on the connection (client.go):
// regions, transfers, queries, KV caches and their grants.

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/stage-kv/stage/wire"
)

// Region describes memory to register.
type Region struct {
	Name      string
	Handle    uint8 // device.HandleKind
	Access    wire.Access
	Ordinal   uint32
	AllocSize uint64 // size of the whole shared allocation
	Offset    uint64 // the region's offset inside it
	Length    uint64
	HandleRaw []byte // IPC handle bytes or export key
	FD        int    // memfd / POSIX fd sent with SCM_RIGHTS; -1 for none
}

// Register registers a region with the sidecar. The fd, if any, stays the
// caller's (the sidecar receives its own copy).
func (c *Client) Register(ctx context.Context, r Region) error {
	req := c.next()
	_, err := c.call(ctx, req, &wire.Register{Req: req, Name: r.Name, Handle: r.Handle, Access: r.Access, Ordinal: r.Ordinal,
		AllocSize: r.AllocSize, Offset: r.Offset, Length: r.Length, HandleRaw: r.HandleRaw}, r.FD)
	return err
}

// Join puts the connection into the group named by token, a secret the
// group's connections share (at least wire.MinGroup bytes, at most
// wire.MaxGroup): they may then use, unregister, check and cancel each
// other's regions, KV caches and transfers, and each subscriber hears of
// the group's transfers. It must be the connection's first request
// (PROTOCOL.md 9.18); without it a connection is a group of its own.
func (c *Client) Join(ctx context.Context, token []byte) error {
	req := c.next()
	_, err := c.call(ctx, req, &wire.Join{Req: req, Group: token}, -1)
	return err
}

// Unregister removes a region. Transfers still using it keep it mapped
// until they end; UnregisterWait says when the memory may be freed.
func (c *Client) Unregister(ctx context.Context, name string) error {
	req := c.next()
	_, err := c.call(ctx, req, &wire.Unregister{Req: req, Name: name}, -1)
	return err
}

// UnregisterWait removes a region and returns once the sidecar no longer
// uses its memory: no transfer holds it and, when it was the last region
// of its allocation, the sidecar closed its import. It waits up to wait
// (at least 1 ms; the sidecar caps it at 10 minutes) for the transfers
// holding the region; if they still do then, the error has code
// wire.CodeBusy and the region stays registered: retry later.
func (c *Client) UnregisterWait(ctx context.Context, name string, wait time.Duration) error {
	ms := max(wait.Milliseconds(), 1)
	if ms > math.MaxUint32 {
		ms = math.MaxUint32
	}
	req := c.next()
	_, err := c.call(ctx, req, &wire.Unregister{Req: req, Name: name, WaitMs: uint32(ms)}, -1)
	return err
}

// Transfer is a transfer to submit. Ops index LocalNames and RemoteNames.
type Transfer struct {
	Route string
	// Peer names the route's peer: its node name or host:port. Empty:
	// the route's only peer (or any, on a route with pick: any); a route
	// of several peers refuses a transfer that names none.
	Peer        string
	Dir         wire.Direction
	Tag         string
	Checksum    uint8 // wire.ChecksumRoute, ChecksumOn, ChecksumOff
	LocalNames  []string
	RemoteNames []string
	Ops         []wire.LocalOp
}

// Submit starts a transfer and returns its id.
func (c *Client) Submit(ctx context.Context, t Transfer) (uint64, error) {
	a, err := c.submit(ctx, t, false)
	return submitted("Submit", a, err)
}

// submitted is the transfer id a Submit or SubmitKV was answered with.
func submitted(what string, a wire.Msg, err error) (uint64, error) {
	if err != nil {
		return 0, err
	}
	s, ok := a.(*wire.Submitted)
	if !ok {
		return 0, fmt.Errorf("stage: %s answered with %s", what, a.Type())
	}
	return s.Transfer, nil
}

// Wait waits for a transfer to finish (timeout 0: no limit besides ctx). A
// failed transfer returns its status and an *Error.
func (c *Client) Wait(ctx context.Context, id uint64, timeout time.Duration) (*wire.XferStatus, error) {
	req := c.next()
	a, err := c.call(ctx, req, &wire.Wait{Req: req, Transfer: id, TimeoutMs: uint32(timeout / time.Millisecond)}, -1)
	if err != nil {
		return nil, err
	}
	return statusResult(a)
}

// Status returns a transfer's state now.
func (c *Client) Status(ctx context.Context, id uint64) (*wire.XferStatus, error) {
	req := c.next()
	a, err := c.call(ctx, req, &wire.Status{Req: req, Transfer: id}, -1)
	if err != nil {
		return nil, err
	}
	return statusResult(a)
}

func statusResult(a wire.Msg) (*wire.XferStatus, error) {
	st, ok := a.(*wire.XferStatus)
	if !ok {
		return nil, fmt.Errorf("stage: expected a transfer status, got %s", a.Type())
	}
	if st.State == wire.StateFailed {
		return st, &Error{Code: st.Code, Msg: st.Message}
	}
	return st, nil
}

// Do submits a transfer and waits for it, in one request (SubmitWait): the
// sidecar answers when the transfer has finished. A failed transfer returns
// its status and an *Error; ctx ending stops the waiting, not the transfer.
func (c *Client) Do(ctx context.Context, t Transfer) (*wire.XferStatus, error) {
	a, err := c.submit(ctx, t, true)
	if err != nil {
		return nil, err
	}
	return statusResult(a)
}

// Cancel cancels a transfer.
func (c *Client) Cancel(ctx context.Context, id uint64) error {
	req := c.next()
	_, err := c.call(ctx, req, &wire.Cancel{Req: req, Transfer: id}, -1)
	return err
}

// Subscribe asks for notifications of transfers that finish on this side
// (peers' pushes that landed here, pulls served from here). The channel
// closes with the connection.
func (c *Client) Subscribe(ctx context.Context) (<-chan *wire.Notify, error) {
	req := c.next()
	if _, err := c.call(ctx, req, &wire.Subscribe{Req: req}, -1); err != nil {
		return nil, err
	}
	return c.notify, nil
}

func (c *Client) query(ctx context.Context, what uint8, arg string, v any) error {
	req := c.next()
	a, err := c.call(ctx, req, &wire.Query{Req: req, What: what, Arg: arg}, -1)
	if err != nil {
		return err
	}
	r, ok := a.(*wire.QueryReply)
	if !ok {
		return fmt.Errorf("stage: expected a query reply, got %s", a.Type())
	}
	return json.Unmarshal(r.JSON, v)
}

// Stats returns the sidecar's figures.
func (c *Client) Stats(ctx context.Context) (*wire.Stats, error) {
	var s wire.Stats
	return &s, c.query(ctx, wire.QueryStats, "", &s)
}

// Routes describes the sidecar's routes.
func (c *Client) Routes(ctx context.Context) ([]wire.RouteInfo, error) {
	var r []wire.RouteInfo
	return r, c.query(ctx, wire.QueryRoutes, "", &r)
}

// Regions lists the regions of this connection and its group (Join);
// other engines' are not listed.
func (c *Client) Regions(ctx context.Context) ([]wire.RegionInfo, error) {
	var r []wire.RegionInfo
	return r, c.query(ctx, wire.QueryRegions, "", &r)
}

// Catalog lists the regions a route's peer offers: route is the route's
// name, or "route@peer" (node name or host:port) on a route of several.
func (c *Client) Catalog(ctx context.Context, route string) ([]wire.RegionInfo, error) {
	var r []wire.RegionInfo
	return r, c.query(ctx, wire.QueryCatalog, route, &r)
}

// RegisterKV gives a KV layout to regions already registered: layers[l][t]
// names the region holding tensor t of layer l (docs/KVLAYOUT.md).
func (c *Client) RegisterKV(ctx context.Context, name string, layout wire.KVLayout, layers [][]string) error {
	req := c.next()
	_, err := c.call(ctx, req, &wire.RegisterKV{Req: req, Name: name, Layout: layout, Layers: layers}, -1)
	return err
}

// GrantKey is a new transfer key for Grant: 16 random bytes (128 bits),
// unguessable, to be used once.
func GrantKey() ([]byte, error) {
	k := make([]byte, wire.MinGrantKey)
	if _, err := rand.Read(k); err != nil {
		return nil, fmt.Errorf("stage: making a transfer key: %w", err)
	}
	return k, nil
}

// Grant lets the peer request that names key read (write false: a pull,
// at most uses times) or write (write true: pushes, uses ignored) exactly
// the block table blocks of this connection's KV cache, for ttl (at most
// wire.MaxGrantTTLMs ms). The cache is guarded from then on: a peer
// request naming no live grant is refused. No blocks: only guard it.
func (c *Client) Grant(ctx context.Context, cache string, key []byte, write bool, blocks []uint32, ttl time.Duration, uses int) error {
	ms := ttl.Milliseconds()
	if ms < 1 || ms > wire.MaxGrantTTLMs {
		return fmt.Errorf("stage: grant of %v: want 1ms to %dms", ttl, wire.MaxGrantTTLMs)
	}
	if write {
		uses = 0
	} else if uses < 1 || uses > wire.MaxGrantUses {
		return fmt.Errorf("stage: read grant of %d uses: want 1 to %d", uses, wire.MaxGrantUses)
	}
	req := c.next()
	_, err := c.call(ctx, req, &wire.Grant{Req: req, Cache: cache, Key: key, Write: write, TTLMs: uint32(ms), Uses: uint16(uses), Blocks: blocks}, -1)
	return err
}

// RevokeGrant ends the grant key on cache (nothing if it ended already).
func (c *Client) RevokeGrant(ctx context.Context, cache string, key []byte) error {
	req := c.next()
	_, err := c.call(ctx, req, &wire.RevokeGrant{Req: req, Cache: cache, Key: key}, -1)
	return err
}

// SubmitKV starts a KV transfer (t.Req is set here) and returns its id.
func (c *Client) SubmitKV(ctx context.Context, t wire.SubmitKV) (uint64, error) {
	t.Req = c.next()
	a, err := c.call(ctx, t.Req, &t, -1)
	return submitted("SubmitKV", a, err)
}
