package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/stage-kv/stage/rawconn"
)

// The raw mode measures plain TCP between the same two hosts with the same
// number of streams: the ceiling stage's figures are compared with, in the
// same run. Senders writev 4 MiB pieces of mmap'd memory and the sink reads
// them with recv(MSG_WAITALL) into mmap'd memory, through rawconn: the same
// system calls stage's data streams make, with no stage logic in between.

const rawPiece = 4 << 20

// mmapBuf maps n bytes, faulted in (MAP_POPULATE) so that no page fault
// lands inside a timed loop.
func mmapBuf(n int) ([]byte, error) {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE|syscall.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap %d B: %w", n, err)
	}
	return b, nil
}

// rawSink accepts connections and reads everything they send.
type rawSink struct {
	ln    net.Listener
	wg    sync.WaitGroup
	spare chan []byte // buffers mapped ahead, one per expected connection
}

// startSink listens on addr; each connection reads 4 MiB pieces into a
// buffer of span bytes, one piece after the other (span = rawPiece keeps
// the buffer hot in the CPU caches; a larger span reads into cold memory,
// as stage's pinned slots are). Buffers for the first conns connections
// are mapped before it returns, so mapping them is not timed.
func startSink(addr string, span, conns int) (*rawSink, error) {
	s := &rawSink{spare: make(chan []byte, conns)}
	for range conns {
		b, err := mmapBuf(span)
		if err != nil {
			s.unmapSpare()
			return nil, fmt.Errorf("sink: %w", err)
		}
		s.spare <- b
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		s.unmapSpare()
		return nil, fmt.Errorf("sink: listen on %s: %w", addr, err)
	}
	s.ln = ln
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				rc, err := rawconn.New(c, 1)
				if err != nil {
					c.Close()
					return
				}
				defer rc.Done()
				var buf []byte
				select {
				case buf = <-s.spare:
				default:
					if buf, err = mmapBuf(span); err != nil {
						return
					}
				}
				defer syscall.Munmap(buf)
				for off := 0; ; off = (off + rawPiece) % span {
					if err := rc.ReadFull(buf[off : off+rawPiece]); err != nil {
						return
					}
				}
			}()
		}
	}()
	return s, nil
}

func (s *rawSink) Addr() string { return s.ln.Addr().String() }

func (s *rawSink) Close() {
	_ = s.ln.Close()
	s.wg.Wait()
	s.unmapSpare()
}

func (s *rawSink) unmapSpare() {
	for {
		select {
		case b := <-s.spare:
			_ = syscall.Munmap(b)
		default:
			return
		}
	}
}

// rawTCP sends total bytes over streams connections to addr and returns
// GB/s and the CPU seconds this process used meanwhile (both ends, when
// the sink runs in it). Each stream writes 4 MiB pieces from a buffer of
// span bytes in turn (see startSink).
func rawTCP(ctx context.Context, addr string, streams int, total uint64, span int) (gbps, cpu float64, err error) {
	per := (total/uint64(streams) + rawPiece - 1) / rawPiece * rawPiece
	conns := make([]net.Conn, streams)
	for i := range conns {
		c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", addr)
		if err != nil {
			for _, c := range conns[:i] {
				c.Close()
			}
			return 0, 0, fmt.Errorf("raw: dial %s: %w", addr, err)
		}
		conns[i] = c
	}
	// Buffers are mapped before the clock starts: only the sending is timed.
	bufs := make([][]byte, streams)
	defer func() {
		for _, b := range bufs {
			if b != nil {
				_ = syscall.Munmap(b)
			}
		}
	}()
	for i := range bufs {
		b, err := mmapBuf(span)
		if err != nil {
			for _, c := range conns {
				c.Close()
			}
			return 0, 0, fmt.Errorf("raw: %w", err)
		}
		bufs[i] = b
	}
	var wg sync.WaitGroup
	errs := make([]error, streams)
	cpu0 := selfCPU()
	start := time.Now()
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rc, err := rawconn.New(c, 1)
			if err != nil {
				c.Close()
				errs[i] = err
				return
			}
			defer rc.Done()
			buf := bufs[i]
			var iov [1][]byte
			off := 0
			for sent := uint64(0); sent < per; sent += rawPiece {
				iov[0] = buf[off : off+rawPiece]
				off = (off + rawPiece) % span
				if err := rc.Writev(iov[:]); err != nil {
					errs[i] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	cpu = selfCPU() - cpu0
	if err := errors.Join(errs...); err != nil {
		return 0, 0, fmt.Errorf("raw: %w", err)
	}
	return float64(per*uint64(streams)) / el.Seconds() / 1e9, cpu, nil
}

func sinkCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sink",
		Short: "accept raw TCP streams and discard them: the far end of `stagectl bench --raw-peer`",
		Args:  cobra.NoArgs,
	}
	listen := cmd.Flags().String("listen", ":7300", "address to listen on")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		s, err := startSink(*listen, rawPiece, 0)
		if err != nil {
			return err
		}
		fmt.Println("sink listening on", s.Addr())
		<-cmd.Context().Done()
		s.Close()
		return nil
	}
	return cmd
}

// newRawRunner returns run, which measures plain TCP once with streams
// connections moving bytes in all, each cycling over span bytes: against an
// in-process sink with spawn (stop closes it), else against the
// `stagectl sink` at peer (whose CPU is not ours to count).
func newRawRunner(ctx context.Context, spawn bool, peer string, streams int, bytes uint64, span int) (run func() (*RawResult, error), stop func(), err error) {
	addr, stop := peer, func() {}
	if spawn {
		sink, err := startSink("127.0.0.1:0", span, streams)
		if err != nil {
			return nil, nil, err
		}
		addr, stop = sink.Addr(), sink.Close
	}
	if addr == "" {
		return nil, nil, fmt.Errorf("--raw needs --spawn or --raw-peer HOST:PORT (a `stagectl sink` on the peer's host)")
	}
	run = func() (*RawResult, error) {
		gbps, cpu, err := rawTCP(ctx, addr, streams, bytes, span)
		if err != nil {
			return nil, err
		}
		r := &RawResult{Streams: streams, Span: uint64(span), GBps: gbps, CPUSecPerGB: cpu / (float64(bytes) / 1e9), Runs: 1, MinGBps: gbps, MaxGBps: gbps}
		if !spawn {
			r.CPUSecPerGB = 0 // the far end's CPU is not ours to see
		}
		return r, nil
	}
	return run, stop, nil
}
