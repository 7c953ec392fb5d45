// Package region is the sidecar's table of the memory local engines
// registered: each region a window of an imported allocation, each
// allocation imported once and counted by reference, every range a peer
// or an engine names checked against it (CheckOps), and what a same-node
// peer needs to import an allocation itself (HandleFor). It knows nothing
// of sessions or transfers.
//
// A region's memory stays mapped while anything holds a reference to it:
// Unregister drops the registration's and returns at once, UnregisterWait
// (unregister.go) returns only once the last reference is gone and the
// import closed, so the engine may free the memory.
package region

import (
	"encoding/hex"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/wire"
)

// Owner is who registered a region: the control-socket connection (Conn,
// unique in the sidecar) and its group (Group: the connections that may
// use, unregister and hear of each other's regions; a connection that
// joined no group is a group of its own). Regions go when their Conn
// closes (ReleaseConn).
type Owner struct {
	Conn  uint64
	Group string
}

// Region is a range of device memory a local engine registered: a window
// [Off, Off+Len) of an imported allocation. Peers name it, never an address.
type Region struct {
	Name   string
	Owner  Owner
	Access wire.Access
	Off    uint64 // offset of the region inside the allocation
	Len    uint64
	Handle device.HandleKind
	ID     uint64 // unique per registration in this sidecar (peers' Revoke names it)
	imp    *importEntry
	refs   atomic.Int64 // 1 for the registration + 1 per transfer using it
	table  *Table
	// closing is set while an UnregisterWait waits for the region's
	// transfers: Acquire refuses it then (guarded by Table.mu).
	closing bool
	// gone, when set, hears of the last reference's release, after the
	// import was let go (UnregisterWait waits on it).
	gone atomic.Pointer[goneSignal]
	// kvOnly: the region holds a guarded KV cache (PROTOCOL.md 9.20), so
	// peers reach it only through KV requests that name a grant; their
	// byte-range requests (AcquireAll) are refused.
	kvOnly atomic.Bool
}

// GuardKV makes peers' byte-range requests on r refused from now on: its
// KV cache is guarded by grants, which only KV requests carry.
func (r *Region) GuardKV() { r.kvOnly.Store(true) }

// InRange reports whether [off, off+n) lies inside a region of size size,
// without overflowing.
func InRange(off, n, size uint64) bool { return n <= size && off <= size-n }

// Seg returns the device range [off, off+n) of the region, or an error
// saying what is out of range.
func (r *Region) Seg(off, n uint64) (device.Seg, error) {
	if n == 0 {
		return device.Seg{}, fmt.Errorf("region %s: empty range at offset %d", r.Name, off)
	}
	if !InRange(off, n, r.Len) {
		return device.Seg{}, fmt.Errorf("region %s: offset %d + length %d is past its end (%d B)", r.Name, off, n, r.Len)
	}
	return device.Seg{Addr: r.imp.mapping.Base() + device.Addr(r.Off+off), Len: n}, nil
}

// Addr is the device address of byte off; callers have bounds-checked.
func (r *Region) Addr(off uint64) device.Addr {
	return r.imp.mapping.Base() + device.Addr(r.Off+off)
}

// Ref takes one more reference, for a holder that got r from one who
// holds one already; Release lets it go.
func (r *Region) Ref() { r.refs.Add(1) }

// Release drops one reference; the last one unmaps the allocation if no
// other region uses it.
func (r *Region) Release() {
	if r.refs.Add(-1) == 0 {
		err := r.table.dropImport(r.imp)
		if g := r.gone.Load(); g != nil {
			g.fire(err)
		}
	}
}

type importEntry struct {
	key     string
	mapping device.Mapping
	exp     device.Handle // what a same-node peer imports (see export.go)
	refs    int           // regions using it (guarded by Table.mu)
}

// Table is the table of registered regions and the imported allocations
// behind them. Each allocation is imported once and counted by reference.
type Table struct {
	dev     device.Device
	mu      sync.RWMutex
	byName  map[string]*Region
	imports map[string]*importEntry
	mapped  atomic.Int64 // mappings open
	nextID  atomic.Uint64
	// onUnregister, when set, hears of every region unregistered (to
	// revoke the handles same-node peers were given).
	onUnregister func(r *Region)
}

// NewTable makes an empty table of regions on dev; onUnregister (nil:
// none) hears of every region unregistered, before its registration's
// reference is dropped (UnregisterWait calls it again once the region is
// released).
func NewTable(dev device.Device, onUnregister func(r *Region)) *Table {
	return &Table{dev: dev, byName: map[string]*Region{}, imports: map[string]*importEntry{}, onUnregister: onUnregister}
}

// handleKey identifies the allocation behind a handle, so two regions of one
// allocation share one import.
func handleKey(h device.Handle) (string, error) {
	switch h.Kind {
	case device.HandleMemfd, device.HandlePosixFD:
		var st unix.Stat_t
		if err := unix.Fstat(h.FD, &st); err != nil {
			return "", fmt.Errorf("fstat fd %d: %w", h.FD, err)
		}
		return fmt.Sprintf("%s:%d:%d", h.Kind, st.Dev, st.Ino), nil
	case device.HandleHostAddr:
		return fmt.Sprintf("host:%x:%d", h.Addr, h.Size), nil
	default:
		return h.Kind.String() + ":" + hex.EncodeToString(h.Bytes), nil
	}
}

// Register imports (or reuses) the allocation behind h and adds a region
// owned by o.
func (t *Table) Register(o Owner, name string, h device.Handle, access wire.Access, off, length uint64) error {
	if length == 0 {
		return status.Errorf(wire.CodeBadRequest, "region %q: length is 0", name)
	}
	if !InRange(off, length, h.Size) {
		return status.Errorf(wire.CodeOutOfRange, "region %q: offset %d + length %d is past the end of its allocation (%d B)", name, off, length, h.Size)
	}
	key, err := handleKey(h)
	if err != nil {
		return status.Errorf(wire.CodeBadRequest, "region %q: %w", name, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, dup := t.byName[name]; dup {
		if old.Owner.Group != o.Group {
			return status.Errorf(wire.CodeExists, "region %q is already registered by another engine connection; choose another name, or wait until its owner unregisters it or closes its connection", name)
		}
		return status.Errorf(wire.CodeExists, "region %q is already registered; unregister it first", name)
	}
	imp := t.imports[key]
	if imp == nil {
		m, err := t.dev.Import(h)
		if err != nil {
			return status.Errorf(wire.CodeDevice, "region %q: import %s allocation of %d B on %s: %w", name, h.Kind, h.Size, t.dev, err)
		}
		exp, err := exportHandle(h)
		if err != nil {
			_ = m.Close()
			return status.Errorf(wire.CodeInternal, "region %q: keep its handle for same-node peers: %w", name, err)
		}
		imp = &importEntry{key: key, mapping: m, exp: exp}
		t.imports[key] = imp
		t.mapped.Add(1)
	} else if imp.mapping.Size() < h.Size {
		return status.Errorf(wire.CodeBadRequest, "region %q: allocation already imported with %d B, now claimed %d B", name, imp.mapping.Size(), h.Size)
	}
	imp.refs++
	r := &Region{Name: name, Owner: o, Access: access, Off: off, Len: length, Handle: h.Kind, ID: t.nextID.Add(1), imp: imp, table: t}
	r.refs.Store(1)
	t.byName[name] = r
	return nil
}

// Unregister removes a region of group g. Transfers still using it keep
// it mapped until they finish.
func (t *Table) Unregister(g, name string) error {
	t.mu.Lock()
	r := t.byName[name]
	if err := checkOwn(r, g, name); err != nil {
		t.mu.Unlock()
		return err
	}
	if r.closing {
		t.mu.Unlock()
		return errClosing(name)
	}
	delete(t.byName, name)
	t.mu.Unlock()
	if t.onUnregister != nil {
		t.onUnregister(r)
	}
	r.Release()
	return nil
}

// Acquire looks a region up by name, checks that it grants want, and
// returns it with a reference the caller must Release.
func (t *Table) Acquire(name string, want wire.Access) (*Region, error) {
	t.mu.RLock()
	r := t.byName[name]
	closing := r != nil && r.closing
	if r != nil && !closing {
		r.refs.Add(1)
	}
	t.mu.RUnlock()
	if r == nil {
		return nil, status.Errorf(wire.CodeUnknownRegion, "region %q is not registered", name)
	}
	if closing {
		return nil, status.Errorf(wire.CodeUnknownRegion, "region %q is being unregistered (an Unregister waits for its transfers to end)", name)
	}
	if r.Access&want != want {
		r.Release()
		return nil, status.Errorf(wire.CodeAccessDenied, "region %q does not grant %s", name, AccessString(want))
	}
	return r, nil
}

// AcquireAll acquires every name, releasing what it took on failure.
// It is for peers' requests, which may name any region; an engine's go
// through AcquireOwn.
func (t *Table) AcquireAll(names []string, want wire.Access) ([]*Region, error) {
	return t.acquireAll(names, want, nil)
}

// AcquireOwn is AcquireAll for an engine of group g: a region of another
// group is refused (AccessDenied), whatever its rights.
func (t *Table) AcquireOwn(g string, names []string, want wire.Access) ([]*Region, error) {
	return t.acquireAll(names, want, &g)
}

func (t *Table) acquireAll(names []string, want wire.Access, g *string) ([]*Region, error) {
	rs := make([]*Region, 0, len(names))
	for _, n := range names {
		r, err := t.Acquire(n, want)
		if err == nil && g != nil && r.Owner.Group != *g {
			r.Release()
			err = errNotOwn(n)
		}
		if err == nil && g == nil && r.kvOnly.Load() {
			r.Release()
			err = status.Errorf(wire.CodeAccessDenied, "region %q holds a KV cache guarded by grants: a peer reads or writes it only with a KV request naming a grant", n)
		}
		if err != nil {
			ReleaseAll(rs)
			return nil, err
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// checkOwn refuses r (named name) unless it exists and group g owns it.
func checkOwn(r *Region, g, name string) error {
	if r == nil {
		return status.Errorf(wire.CodeUnknownRegion, "region %q is not registered", name)
	}
	if r.Owner.Group != g {
		return errNotOwn(name)
	}
	return nil
}

func errNotOwn(name string) error {
	return status.Errorf(wire.CodeAccessDenied, "region %q belongs to another engine connection; a connection may use only its own regions and those of its group (Join, PROTOCOL.md 9.18)", name)
}

// ReleaseAll releases one reference of every region of rs.
func ReleaseAll(rs []*Region) {
	for _, r := range rs {
		r.Release()
	}
}

// dropImport lets go of one region's use of imp; the last closes it and
// returns what closing the mapping said.
func (t *Table) dropImport(imp *importEntry) error {
	t.mu.Lock()
	imp.refs--
	last := imp.refs == 0
	if last {
		delete(t.imports, imp.key)
	}
	t.mu.Unlock()
	if !last {
		return nil
	}
	err := imp.mapping.Close()
	closeExport(imp.exp)
	t.mapped.Add(-1)
	return err
}

// Count returns regions registered and allocations mapped.
func (t *Table) Count() (regions, mappings int) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.byName), int(t.mapped.Load())
}

// Infos lists the regions peers may use, for catalogs, sorted by name.
func (t *Table) Infos() []wire.RegionInfo {
	return t.infos(func(r *Region) bool { return r.Access&(wire.AccessRemoteRead|wire.AccessRemoteWrite) != 0 })
}

// InfosOf lists group g's regions (an engine's QueryRegions), sorted by
// name.
func (t *Table) InfosOf(g string) []wire.RegionInfo {
	return t.infos(func(r *Region) bool { return r.Owner.Group == g })
}

func (t *Table) infos(keep func(*Region) bool) []wire.RegionInfo {
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make([]wire.RegionInfo, 0, len(t.byName))
	for _, r := range t.byName {
		if !keep(r) {
			continue
		}
		out = append(out, wire.RegionInfo{Name: r.Name, Size: r.Len, Access: r.Access, Device: t.dev.String()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// CloseAll unregisters everything (shutdown). A region an UnregisterWait
// is waiting for is dropped from the table too; that waiter owns its
// registration's reference.
func (t *Table) CloseAll() {
	t.mu.Lock()
	rs := make([]*Region, 0, len(t.byName))
	for _, r := range t.byName {
		if !r.closing {
			rs = append(rs, r)
		}
	}
	t.byName = map[string]*Region{}
	t.mu.Unlock()
	ReleaseAll(rs)
}

// AccessString names the rights of a ("local-read+remote-write").
func AccessString(a wire.Access) string {
	s := ""
	add := func(bit wire.Access, name string) {
		if a&bit != 0 {
			if s != "" {
				s += "+"
			}
			s += name
		}
	}
	add(wire.AccessLocalRead, "local-read")
	add(wire.AccessLocalWrite, "local-write")
	add(wire.AccessRemoteWrite, "remote-write")
	add(wire.AccessRemoteRead, "remote-read")
	if s == "" {
		return "none"
	}
	return s
}
