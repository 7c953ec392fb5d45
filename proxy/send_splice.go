package proxy

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/rawconn"
	"github.com/stage-kv/stage/staging"
)

// Splice send (staging.splice_send): writers hand payloads to the socket
// by reference, so the core holds each spliced slot until its chunk is
// answered, and slots given up unanswered come back here tainted: they get
// fresh pages (renewSlots) before the core may use them again. See
// staging/splice.go for the rules and docs/OPERATIONS.md for the trade.

// openPool makes the send pool: renewable slots when splice send is
// on, and decides whether it is. staging.splice_send (on by default)
// applies where it can: a plaintext sidecar whose device renews slot pages
// and whose slots are whole pages. Elsewhere chunks go by writev, and the
// start log says why.
func (sd *sender) openPool(slot, n int) (*staging.Pool, error) {
	why := ""
	if _, ok := sd.s.dev.(device.SlotRenewer); !ok {
		why = fmt.Sprintf("device %s cannot give slots fresh pages", sd.s.dev)
	}
	if slot%int(config.SplicePage) != 0 {
		why = fmt.Sprintf("staging.slot_size %d B is not a multiple of %d B", slot, config.SplicePage)
	}
	if sd.s.tls != nil {
		why = "security.tls encrypts into its own buffers"
	}
	sd.splice = sd.s.cfg.Staging.SpliceSend && why == ""
	switch {
	case sd.s.cfg.Staging.SpliceSend && why != "":
		sd.s.log.Info("staging.splice_send does not apply here; chunks are sent with writev", zap.String("why", why))
	case sd.splice && sd.s.cfg.Staging.SpliceProbe:
		sd.splice = sd.spliceFaster(slot)
	}
	if sd.splice {
		sd.s.log.Info("splice send on: chunk payloads go by vmsplice+splice; a send slot is held until its chunk is acked")
	}
	if !sd.splice {
		return staging.NewPool(sd.s.dev, slot, n)
	}
	return staging.NewRenewablePool(sd.s.dev, slot, n)
}

// renewSlots gives tainted send slots fresh pages off the core's goroutine
// and hands each back to the core (EvRenewed). A slot that cannot be
// renewed is never used again: the core leaves it out.
func (sd *sender) renewSlots(slots []staging.SendSlot) {
	sd.s.wg.Add(1)
	go func() {
		defer sd.s.wg.Done()
		for _, i := range slots {
			err := sd.pool.Renew(int(i))
			if err == nil {
				sd.s.metrics.renewals.Add(1)
			} else {
				sd.s.log.Error("send slot taken out of use: it could not get fresh pages after a spliced chunk was given up", zap.Int("slot", int(i)), zap.Error(err))
			}
			sd.mbox.post(staging.Event{Kind: staging.EvRenewed, Slot: i, Err: err, Now: time.Now()})
		}
	}()
}

// splicer is what a data stream needs to send by reference (rawconn).
type splicer interface {
	WriteSplice(head, payload []byte) (spliced bool, refused, err error)
	PrepareSplice(n int) error
}

// prepareSplice makes a new plaintext stream's splice pipe, sized for our
// slots, when splice send is on; a stream that cannot have one is refused.
func (sd *sender) prepareSplice(rc streamConn) error {
	sp, ok := rc.(splicer)
	if !sd.splice || !ok {
		return nil
	}
	if err := sp.PrepareSplice(sd.pool.SlotSize()); err != nil {
		return fmt.Errorf("data stream for splice send: %w", err)
	}
	return nil
}

var _ splicer = (*rawconn.Conn)(nil)

// writeChunk writes head and payload on ds: by splice when the server is
// in splice mode and the stream is plaintext, else with one writev.
// spliced says whether the kernel took the payload's pages by reference.
func (w *chunkWriter) writeChunk(head, payload []byte) (spliced bool, err error) {
	ds := w.ds
	if sp, ok := ds.rc.(splicer); ok && ds.ss.s.sender.splice {
		spliced, refused, err := sp.WriteSplice(head, payload)
		if refused != nil && ds.ss.s.sender.spliceRefused.CompareAndSwap(false, true) {
			ds.ss.s.log.Warn("vmsplice refused a send slot; sending such payloads with writev (logged once)", zap.Error(refused))
		}
		return spliced, err
	}
	w.iov[0], w.iov[1] = head, payload
	return false, ds.rc.Writev(w.iov[:])
}

// probeSize caps the payload of the start-up splice probe: 8 of them go
// each way per round.
const probeSize = 4 << 20

// spliceFaster runs the start-up probe (staging.splice_probe): splice send
// stays on only if it moved at least as much as writev over loopback on
// this machine. A probe that fails leaves it on (what was configured).
func (sd *sender) spliceFaster(slot int) bool {
	probe := sd.spliceProbe
	if probe == nil {
		probe = func(size int) (rawconn.SpliceProbe, error) { return rawconn.ProbeSplice(size, 3) }
	}
	start := time.Now()
	p, err := probe(min(slot, probeSize))
	took := zap.Duration("took", time.Since(start).Round(time.Millisecond))
	switch {
	case err != nil:
		sd.s.log.Warn("splice send probe failed; keeping splice send on as configured", zap.Error(err), took)
		return true
	case !p.Faster():
		sd.s.log.Info("splice send off: on this machine it moved less than writev over loopback (staging.splice_probe); chunks are sent with writev",
			zap.Stringer("probe", p), took)
		return false
	}
	sd.s.log.Info("splice send probe: splice moved at least as much as writev over loopback", zap.Stringer("probe", p), took)
	return true
}
