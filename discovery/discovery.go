// Package discovery finds a route's peers in DNS: a name (a Kubernetes
// headless Service answers with one record per ready pod) resolved again
// on an interval with Go's resolver, optionally pointed at one DNS server.
package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"time"
)

// Resolver is Go's own resolver asking server (host:port) for every
// query, or net.DefaultResolver when server is empty.
func Resolver(server string) *net.Resolver {
	if server == "" {
		return net.DefaultResolver
	}
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, server)
	}}
}

// Lookup resolves the host of hostport and returns host:port for each of
// its addresses, sorted. A name that does not exist (a headless Service
// with no ready pod) is an empty set, not an error: its peers are gone.
func Lookup(ctx context.Context, r *net.Resolver, hostport string) ([]string, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, fmt.Errorf("dns %q: %w", hostport, err)
	}
	ips, err := r.LookupHost(ctx, host)
	if err != nil {
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			return nil, nil
		}
		return nil, fmt.Errorf("resolve %s: %w", host, err)
	}
	out := make([]string, 0, len(ips))
	seen := map[string]bool{}
	for _, ip := range ips {
		a := net.JoinHostPort(ip, port)
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Watch resolves hostport at once and then every interval until ctx
// ends, handing each answer (or error) to update. A lookup may take at
// most the interval or 5s, whichever is longer.
func Watch(ctx context.Context, r *net.Resolver, hostport string, interval time.Duration, update func([]string, error)) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		lctx, cancel := context.WithTimeout(ctx, max(interval, 5*time.Second))
		addrs, err := Lookup(lctx, r, hostport)
		cancel()
		if ctx.Err() != nil {
			return
		}
		update(addrs, err)
		t.Reset(interval)
	}
}
