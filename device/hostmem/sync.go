package hostmem

import (
	"github.com/stage-kv/stage/device"
)

var _ device.SyncCopier = (*Dev)(nil)

// GatherSync copies segs into dst on the calling goroutine, with the same
// checks, fault injection and bandwidth/latency model as a stream's copy.
func (d *Dev) GatherSync(dst device.Pinned, segs []device.Seg) error {
	return d.moveSync(opGather, dst, segs)
}

// ScatterSync copies src into segs on the calling goroutine; see GatherSync.
func (d *Dev) ScatterSync(segs []device.Seg, src device.Pinned) error {
	return d.moveSync(opScatter, src, segs)
}

func (d *Dev) moveSync(kind opKind, p device.Pinned, segs []device.Seg) error {
	d.syncMu.RLock()
	defer d.syncMu.RUnlock()
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return d.errClosed(kind.String() + " (synchronous)")
	}
	what := d.name + " synchronous copy"
	if err := checkCopy(what, kind, p, segs); err != nil {
		return err
	}
	return d.move(what, kind, p.Host(), segs)
}
