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

func mmapBuf(n int) ([]byte, error) {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("mmap %d B: %w", n, err)
	}
	for i := range b {
		b[i] = byte(i)
	}
	return b, nil
}

// rawSink accepts connections and reads everything they send.
type rawSink struct {
	ln net.Listener
	wg sync.WaitGroup
}

func startSink(addr string) (*rawSink, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("sink: listen on %s: %w", addr, err)
	}
	s := &rawSink{ln: ln}
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
				buf, err := mmapBuf(rawPiece)
				if err != nil {
					return
				}
				defer syscall.Munmap(buf)
				for {
					if err := rc.ReadFull(buf); err != nil {
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
}

// rawTCP sends total bytes over streams connections to addr and returns GB/s.
func rawTCP(ctx context.Context, addr string, streams int, total uint64) (float64, error) {
	per := (total/uint64(streams) + rawPiece - 1) / rawPiece * rawPiece
	conns := make([]net.Conn, streams)
	for i := range conns {
		c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", addr)
		if err != nil {
			for _, c := range conns[:i] {
				c.Close()
			}
			return 0, fmt.Errorf("raw: dial %s: %w", addr, err)
		}
		conns[i] = c
	}
	var wg sync.WaitGroup
	errs := make([]error, streams)
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
			buf, err := mmapBuf(rawPiece)
			if err != nil {
				errs[i] = err
				return
			}
			defer syscall.Munmap(buf)
			var iov [1][]byte
			for sent := uint64(0); sent < per; sent += rawPiece {
				iov[0] = buf
				if err := rc.Writev(iov[:]); err != nil {
					errs[i] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return 0, fmt.Errorf("raw: %w", err)
	}
	return float64(per*uint64(streams)) / el.Seconds() / 1e9, nil
}

func sinkCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sink",
		Short: "accept raw TCP streams and discard them: the far end of `stagectl bench --raw-peer`",
		Args:  cobra.NoArgs,
	}
	listen := cmd.Flags().String("listen", ":7300", "address to listen on")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		s, err := startSink(*listen)
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
