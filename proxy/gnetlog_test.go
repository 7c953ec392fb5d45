package proxy

import (
	"sync/atomic"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestGnetLogger(t *testing.T) {
	for _, tc := range []struct {
		name   string
		closed bool
		want   int
	}{
		{"open server", false, 4},
		{"closed server", true, 0},
	} {
		core, logs := observer.New(zapcore.DebugLevel)
		var off atomic.Bool
		off.Store(tc.closed)
		g := newGnetLogger(zap.New(core), &off)
		g.Debugf("d %d", 1)
		g.Infof("Starting gnet client with %d event loops", 2)
		g.Warnf("w")
		g.Errorf("e")
		if got := logs.Len(); got != tc.want {
			t.Errorf("%s: %d lines logged, want %d", tc.name, got, tc.want)
		}
		if tc.want > 0 {
			e := logs.All()[1]
			if e.LoggerName != "gnet" || e.Message != "Starting gnet client with 2 event loops" || e.Level != zapcore.InfoLevel {
				t.Errorf("%s: logged %q at %v by %q, want gnet's line at info by \"gnet\"", tc.name, e.Message, e.Level, e.LoggerName)
			}
		}
	}
}
