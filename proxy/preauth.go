// Bounds on peer connections before authentication, as sshd's MaxStartups:
// a connection that has not finished its handshake costs a goroutine, a
// file descriptor and buffers, and anyone who can reach the port can open
// one. So at most limits.max_handshakes are in progress at once, at most
// limits.max_handshakes_per_addr from one source address; past either, a
// new connection is closed the moment it is accepted, with no goroutine.
// The per-address bound keeps a flood from one address from taking every
// place; a flood from many addresses can still fill them until their
// handshakes time out (limits.handshake_timeout), which is the price of
// any such bound.
//
// The WARN lines of refusals and failed handshakes go through a sampler
// (a burst per second per message, then nothing until the next second),
// and what it dropped is summed up once per preauthSummaryEvery, so a
// flood costs a few lines per second of log, not one per connection.

package proxy

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Sampling of the pre-authentication WARN lines: the first preauthBurst
// lines of each message per second are written, the rest counted.
const (
	preauthBurst        = 20
	preauthSummaryEvery = 10 * time.Second
)

// Why a connection was refused before its handshake (the reason label of
// stage_preauth_refused_total).
const (
	refusedTotal = iota
	refusedPerAddr
	refusedReasons
)

var refusedLabels = [refusedReasons]string{"total", "per_addr"}

// preauth counts connections whose handshake is in progress.
type preauth struct {
	maxTotal, maxPerAddr int

	mu     sync.Mutex
	total  int
	byAddr map[netip.Addr]int

	refused    [refusedReasons]atomic.Uint64
	suppressed atomic.Uint64 // WARN lines the sampler dropped since the last summary
	lastSum    time.Time     // on the sender loop only
	log        *zap.Logger   // sampled
}

func newPreauth(maxTotal, maxPerAddr int, log *zap.Logger) *preauth {
	p := &preauth{maxTotal: maxTotal, maxPerAddr: maxPerAddr, byAddr: map[netip.Addr]int{}}
	p.log = log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, time.Second, preauthBurst, 0,
			zapcore.SamplerHook(func(_ zapcore.Entry, d zapcore.SamplingDecision) {
				if d&zapcore.LogDropped != 0 {
					p.suppressed.Add(1)
				}
			}))
	}))
	return p
}

// sourceAddr is the address a peer connection comes from; connections
// that have none (not TCP) share the zero address.
func sourceAddr(c net.Conn) netip.Addr {
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return ta.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// admit takes a place for a new connection from a, or says which bound
// refuses it.
func (p *preauth) admit(a netip.Addr) (reason int, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.total >= p.maxTotal:
		reason = refusedTotal
	case p.byAddr[a] >= p.maxPerAddr:
		reason = refusedPerAddr
	default:
		p.total++
		p.byAddr[a]++
		return 0, true
	}
	p.refused[reason].Add(1)
	return reason, false
}

// release gives back the place of a connection from a whose handshake
// ended, one way or the other.
func (p *preauth) release(a netip.Addr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.total--
	if n := p.byAddr[a] - 1; n > 0 {
		p.byAddr[a] = n
	} else {
		delete(p.byAddr, a)
	}
}

// inProgress is the number of handshakes in progress.
func (p *preauth) inProgress() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.total
}

// refuse closes a connection that a bound refused, and says so (sampled).
func (p *preauth) refuse(c net.Conn, reason int) {
	_ = c.Close()
	key := "limits.max_handshakes"
	if reason == refusedPerAddr {
		key = "limits.max_handshakes_per_addr"
	}
	p.log.Warn("refused peer connection: too many handshakes in progress", zap.String("remote", c.RemoteAddr().String()),
		zap.String("limit", key), zap.Int("max_handshakes", p.maxTotal), zap.Int("max_handshakes_per_addr", p.maxPerAddr))
}

// summarize runs on the sender loop's tick: once per preauthSummaryEvery,
// if the sampler dropped lines meanwhile, one line says how many, with
// the refusals so far.
func (p *preauth) summarize(now time.Time, log *zap.Logger) {
	if now.Sub(p.lastSum) < preauthSummaryEvery {
		return
	}
	p.lastSum = now
	if n := p.suppressed.Swap(0); n > 0 {
		log.Warn("peer connection warnings suppressed (a burst per second is logged); a flood of connections?",
			zap.Uint64("suppressed", n), zap.Uint64("refused_total", p.refused[refusedTotal].Load()),
			zap.Uint64("refused_per_addr", p.refused[refusedPerAddr].Load()), zap.Int("handshakes_in_progress", p.inProgress()))
	}
}
