package proxy

import (
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/proxy/engine"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/proxy/routing"
	"github.com/stage-kv/stage/wire"
)

// engineHost is the server as the control socket (package engine) sees
// it: what each engine request does. Submitting, looking up and
// cancelling an engine's transfers are its own (send_submit.go, send_submitkv.go); the
// tables they land in are the server's.
type engineHost struct{ s *Server }

var _ engine.Backend = engineHost{}

func (h engineHost) Unregister(o engine.Owner, name string) error {
	return h.s.regions.Unregister(o.Group, name)
}

func (h engineHost) UnregisterWait(o engine.Owner, name string, wait time.Duration, cancel <-chan struct{}) error {
	return h.s.regions.UnregisterWait(o.Group, name, wait, cancel)
}

// RegisterKV registers a KV cache; when it replaced one of another shape,
// peers that cached the old shape forget it (an unasked KVInfo, Seq 0), so
// their next transfer asks again instead of being refused; one already on
// its way is refused and may be retried.
func (h engineHost) RegisterKV(o engine.Owner, m *wire.RegisterKV) error {
	reshaped, err := h.s.kv.register(region.Owner(o), m)
	if err != nil {
		return err
	}
	if reshaped {
		for _, ss := range h.s.sessions.liveList() {
			ss.send(&wire.KVInfo{Name: m.Name})
		}
	}
	return nil
}

// Grant records o's grant on its KV cache (kvgrant.go).
func (h engineHost) Grant(o engine.Owner, m *wire.Grant) error {
	return h.s.kv.grant(o.Group, m, time.Now())
}

// RevokeGrant ends o's grant on its KV cache.
func (h engineHost) RevokeGrant(o engine.Owner, m *wire.RevokeGrant) error {
	return h.s.kv.revoke(o.Group, m)
}

func (h engineHost) Submit(o engine.Owner, m *wire.Submit, wait bool) (engine.Transfer, error) {
	lx, err := h.submit(h.s.ctx, o.Group, m, wait)
	if errors.Is(err, routing.ErrNoSession) {
		return nil, engine.ErrWouldWait
	}
	return engineXfer(lx, err)
}

// SubmitKV also counts the time to accept (the first KV transfer to a
// peer's cache waits for its shape).
func (h engineHost) SubmitKV(o engine.Owner, m *wire.SubmitKV) (engine.Transfer, error) {
	t0 := time.Now()
	lx, err := h.submitKV(h.s.ctx, o.Group, m)
	if err == nil {
		h.s.metrics.kvAccepts.Add(1)
		h.s.metrics.kvAcceptN.Add(uint64(time.Since(t0)))
	}
	return engineXfer(lx, err)
}

func (h engineHost) Lookup(o engine.Owner, id uint64) (engine.Transfer, error) {
	return engineXfer(h.lookup(o.Group, id))
}

// Query answers stagectl's stats, routes, regions and catalog queries;
// an engine's regions query lists its group's regions only.
func (h engineHost) Query(o engine.Owner, q *wire.Query) ([]byte, error) {
	s := h.s
	switch q.What {
	case wire.QueryStats:
		return json.Marshal(s.Snapshot())
	case wire.QueryFeatures:
		return json.Marshal(wire.OurFeatures())
	case wire.QueryRoutes:
		return json.Marshal(s.Routes())
	case wire.QueryRegions:
		return json.Marshal(s.regions.InfosOf(o.Group))
	case wire.QueryCatalog:
		// Arg is the route's name, or route@peer on a route of several.
		routeName, peerName, _ := strings.Cut(q.Arg, "@")
		r, err := s.routes.Lookup(routeName)
		if err != nil {
			return nil, err
		}
		ss, err := r.Pick(s.ctx, peerName)
		if err != nil {
			return nil, err
		}
		return askCatalog(ss, s.newID())
	case wire.QueryDevice:
		info, err := deviceInfo(s.dev)
		if err != nil {
			return nil, err
		}
		return json.Marshal(info)
	}
	return nil, codeErr(wire.CodeBadRequest, "unknown query %d", q.What)
}

// engineTransfer is a localXfer as an engine's connection sees it.
type engineTransfer struct{ lx *localXfer }

func engineXfer(lx *localXfer, err error) (engine.Transfer, error) {
	if err != nil {
		return nil, err
	}
	return engineTransfer{lx}, nil
}

func (t engineTransfer) ID() uint64                         { return t.lx.id }
func (t engineTransfer) Status(req uint64) *wire.XferStatus { return t.lx.status(req) }
func (t engineTransfer) Done() <-chan struct{}              { return t.lx.done }
func (t engineTransfer) WhenDone(f func())                  { t.lx.whenDone(f) }

// Register validates a Register and imports the memory.
func (h engineHost) Register(o engine.Owner, m *wire.Register, fd int) error {
	s := h.s
	if m.Name == "" {
		return codeErr(wire.CodeBadRequest, "region name is empty")
	}
	if m.Access == 0 || m.Access&^wire.AccessAll != 0 {
		return codeErr(wire.CodeBadRequest, "region %q: access bits %#x: grant at least one of local-read, local-write, remote-write, remote-read", m.Name, m.Access)
	}
	if int(m.Ordinal) != s.dev.Ordinal() {
		return codeErr(wire.CodeBadRequest, "region %q is on device %d; this sidecar serves %s: register it with the sidecar of its device "+
			"(one sidecar per device), numbering devices as that sidecar does (CUDA_VISIBLE_DEVICES, ASCEND_RT_VISIBLE_DEVICES and "+
			"HIP_VISIBLE_DEVICES renumber them from 0 in each process)", m.Name, m.Ordinal, s.dev)
	}
	hk := device.HandleKind(m.Handle)
	if hk == device.HandleHostAddr {
		return codeErr(wire.CodeAccessDenied, "region %q: raw addresses cannot be registered through the control socket", m.Name)
	}
	needFD := hk == device.HandleMemfd || hk == device.HandlePosixFD
	if needFD && fd < 0 {
		return codeErr(wire.CodeBadRequest, "region %q: a %s handle needs its fd sent with the frame (SCM_RIGHTS)", m.Name, hk)
	}
	dh := device.Handle{Kind: hk, Bytes: m.HandleRaw, FD: fd, Size: m.AllocSize}
	return s.regions.Register(region.Owner(o), m.Name, dh, m.Access, m.Offset, m.Length)
}
