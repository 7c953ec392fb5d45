package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"go.uber.org/zap"
)

// servePprof serves the Go profiler on addr, on its own mux so nothing else
// is exposed there. Bind it to loopback: profiles show memory contents.
// It returns the address it listens on (addr may name port 0).
func servePprof(addr string, log *zap.Logger) (bound string, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("--pprof %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("pprof server stopped", zap.Error(err))
		}
	}()
	log.Info("serving profiles", zap.String("addr", "http://"+ln.Addr().String()+"/debug/pprof/"))
	return ln.Addr().String(), func() { _ = srv.Close() }, nil
}
