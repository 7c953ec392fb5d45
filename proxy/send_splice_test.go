package proxy

import (
	"errors"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/hostmem"
	"github.com/stage-kv/stage/rawconn"
)

// plainDevice hides every optional interface of the device it wraps (a
// device that cannot renew slot pages, as hip and acl).
type plainDevice struct{ device.Device }

// staging.splice_send applies where it can and falls back to writev, with
// the reason in the start log, where it cannot; with staging.splice_probe,
// only where the probe found it at least as fast as writev.
func TestSpliceSendApplies(t *testing.T) {
	faster := rawconn.SpliceProbe{Writev: 2e9, Splice: 3e9}
	slower := rawconn.SpliceProbe{Writev: 3e9, Splice: 2e9}
	dv, err := hostmem.Open(0, device.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dv.Close() })
	for _, tt := range []struct {
		name   string
		on     bool
		dev    device.Device
		slot   int
		tls    bool
		splice bool
		why    string               // in the start log when it does not apply
		probe  *rawconn.SpliceProbe // staging.splice_probe on, and what it finds (nil: probe off)
		fails  bool                 // the probe fails
		runs   bool                 // the probe must run (only where splice send would apply)
	}{
		{name: "on, hostmem", on: true, dev: dv, slot: 64 << 10, splice: true},
		{name: "off", dev: dv, slot: 64 << 10, probe: &faster},
		{name: "device cannot renew pages", on: true, dev: plainDevice{dv}, slot: 64 << 10, why: "cannot give slots fresh pages", probe: &faster},
		{name: "slots not whole pages", on: true, dev: dv, slot: 64<<10 + 1, why: "not a multiple of 4096 B", probe: &faster},
		{name: "TLS", on: true, dev: dv, slot: 64 << 10, tls: true, why: "security.tls", probe: &faster},
		{name: "probe: splice faster", runs: true, on: true, dev: dv, slot: 64 << 10, splice: true, why: "splice moved at least as much", probe: &faster},
		{name: "probe: writev faster", runs: true, on: true, dev: dv, slot: 64 << 10, why: "splice send off: on this machine", probe: &slower},
		{name: "probe fails", runs: true, on: true, dev: dv, slot: 64 << 10, splice: true, why: "probe failed; keeping splice send on", probe: &faster, fails: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.InfoLevel)
			cfg := config.Default()
			cfg.Staging.SpliceSend = tt.on
			cfg.Staging.SpliceProbe = tt.probe != nil
			probed := 0
			s := &Server{cfg: cfg, dev: tt.dev, log: zap.New(core)}
			s.sender = sender{s: s, spliceProbe: func(size int) (rawconn.SpliceProbe, error) {
				probed++
				if size != tt.slot {
					t.Errorf("probe of %d B payloads, want the slot size %d", size, tt.slot)
				}
				if tt.fails {
					return rawconn.SpliceProbe{}, errors.New("no loopback")
				}
				return *tt.probe, nil
			}}
			if tt.tls {
				s.tls = &peerTLS{}
			}
			p, err := s.sender.openPool(tt.slot, 2)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if s.sender.splice != tt.splice {
				t.Fatalf("splice %v, want %v", s.sender.splice, tt.splice)
			}
			if want := map[bool]int{true: 1}[tt.runs]; probed != want {
				t.Fatalf("probe ran %d times, want %d", probed, want)
			}
			var log []string
			for _, e := range logs.All() {
				log = append(log, entryText(e))
			}
			if all := strings.Join(log, "\n"); tt.why != "" && !strings.Contains(all, tt.why) {
				t.Fatalf("start log %q does not say %q", all, tt.why)
			}
		})
	}
}
