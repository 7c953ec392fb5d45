package proxy

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/rawconn"
	"github.com/stage-kv/stage/staging"
)

// Splice send (staging.splice_send): writers hand payloads to the socket
// by reference, so the core holds each spliced slot until its chunk is
// answered, and slots given up unanswered come back here tainted: they get
// fresh pages (renewSlots) before the core may use them again. See
// staging/splice.go for the rules and docs/OPERATIONS.md for the trade.

// newSendPool makes the send pool: renewable slots when splice send is
// on, and decides whether it is.
func (s *Server) newSendPool(slot, n int) (*staging.Pool, error) {
	if s.cfg.Staging.SpliceSend && s.tls != nil {
		s.log.Info("staging.splice_send has no effect with security.tls: TLS encrypts into its own buffers, so chunks are sent with writev")
	}
	s.splice = s.cfg.Staging.SpliceSend && s.tls == nil
	if !s.splice {
		return staging.NewPool(s.dev, slot, n)
	}
	if _, ok := s.dev.(device.SlotRenewer); !ok {
		return nil, fmt.Errorf("staging.splice_send: device %s cannot renew slot pages; turn it off", s.dev)
	}
	s.log.Info("splice send on: chunk payloads go by vmsplice+splice; a send slot is held until its chunk is acked")
	return staging.NewRenewablePool(s.dev, slot, n)
}

// renewSlots gives tainted send slots fresh pages off the core's goroutine
// and hands each back to the core (EvRenewed). A slot that cannot be
// renewed is never used again: the core leaves it out.
func (s *Server) renewSlots(slots []int) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for _, i := range slots {
			err := s.sendPool.Renew(i)
			if err != nil {
				s.log.Error("send slot taken out of use: it could not get fresh pages after a spliced chunk was given up", zap.Int("slot", i), zap.Error(err))
			}
			s.mbox.post(staging.Event{Kind: staging.EvRenewed, Slot: i, Err: err, Now: time.Now()})
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
func (s *Server) prepareSplice(rc streamConn) error {
	sp, ok := rc.(splicer)
	if !s.splice || !ok {
		return nil
	}
	if err := sp.PrepareSplice(s.sendPool.SlotSize()); err != nil {
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
	if sp, ok := ds.rc.(splicer); ok && ds.ss.s.splice {
		spliced, refused, err := sp.WriteSplice(head, payload)
		if refused != nil && ds.ss.s.spliceRefused.CompareAndSwap(false, true) {
			ds.ss.s.log.Warn("vmsplice refused a send slot; sending such payloads with writev (logged once)", zap.Error(refused))
		}
		return spliced, err
	}
	w.iov[0], w.iov[1] = head, payload
	return false, ds.rc.Writev(w.iov[:])
}
