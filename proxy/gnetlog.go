package proxy

import (
	"sync/atomic"

	"go.uber.org/zap"
)

// gnetLogger hands gnet's log lines to the server's zap logger. Without
// it gnet writes them to stdout ("[gnet] ... Starting gnet client with N
// event loops"), ahead of staged's ready line, which a supervisor reads
// as the first line of stdout.
//
// gnet keeps one logger per process (the last client started sets it), so
// a server closed in a process that runs several (tests) stops writing
// through it rather than logging into a logger its owner let go of.
type gnetLogger struct {
	log *zap.SugaredLogger
	off *atomic.Bool // the server closed
}

func newGnetLogger(log *zap.Logger, off *atomic.Bool) gnetLogger {
	return gnetLogger{log: log.Named("gnet").WithOptions(zap.AddCallerSkip(2)).Sugar(), off: off}
}

func (g gnetLogger) Debugf(format string, args ...any) {
	if !g.off.Load() {
		g.log.Debugf(format, args...)
	}
}

func (g gnetLogger) Infof(format string, args ...any) {
	if !g.off.Load() {
		g.log.Infof(format, args...)
	}
}

func (g gnetLogger) Warnf(format string, args ...any) {
	if !g.off.Load() {
		g.log.Warnf(format, args...)
	}
}

func (g gnetLogger) Errorf(format string, args ...any) {
	if !g.off.Load() {
		g.log.Errorf(format, args...)
	}
}

// Fatalf is gnet giving up on the process; it exits even after Close.
func (g gnetLogger) Fatalf(format string, args ...any) { g.log.Fatalf(format, args...) }
