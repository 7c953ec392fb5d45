package proxy

import (
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/hostmem"
)

// plainDevice hides every optional interface of the device it wraps (a
// device that cannot renew slot pages, as hip and acl).
type plainDevice struct{ device.Device }

// staging.splice_send applies where it can and falls back to writev, with
// the reason in the start log, where it cannot.
func TestSpliceSendApplies(t *testing.T) {
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
		why    string // in the start log when it does not apply
	}{
		{"on, hostmem", true, dv, 64 << 10, false, true, ""},
		{"off", false, dv, 64 << 10, false, false, ""},
		{"device cannot renew pages", true, plainDevice{dv}, 64 << 10, false, false, "cannot give slots fresh pages"},
		{"slots not whole pages", true, dv, 64<<10 + 1, false, false, "not a multiple of 4096 B"},
		{"TLS", true, dv, 64 << 10, true, false, "security.tls"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.InfoLevel)
			cfg := config.Default()
			cfg.Staging.SpliceSend = tt.on
			s := &Server{cfg: cfg, dev: tt.dev, log: zap.New(core)}
			if tt.tls {
				s.tls = &peerTLS{}
			}
			p, err := s.newSendPool(tt.slot, 2)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if s.splice != tt.splice {
				t.Fatalf("splice %v, want %v", s.splice, tt.splice)
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
