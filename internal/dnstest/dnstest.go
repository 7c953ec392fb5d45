// Package dnstest runs a real DNS server (github.com/miekg/dns) on a test
// address, answering A and AAAA queries from records a test sets and
// changes while it runs; names it does not have are NXDOMAIN. Tests point
// Go's resolver at it (discovery.Resolver, routes[].dns_server).
package dnstest

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// Server is a DNS server on one address, UDP and TCP.
type Server struct {
	udp, tcp *dns.Server
	addr     string
	mu       sync.Mutex
	records  map[string][]net.IP // by lower-case FQDN
	queries  atomic.Int64
	fail     atomic.Bool
}

// Start serves on addr ("127.0.0.1:0": a free port, the same for UDP and TCP).
func Start(addr string) (*Server, error) {
	pc, ln, err := listen(addr)
	if err != nil {
		return nil, err
	}
	s := &Server{addr: pc.LocalAddr().String(), records: map[string][]net.IP{}}
	s.udp = &dns.Server{PacketConn: pc, Handler: s}
	s.tcp = &dns.Server{Listener: ln, Handler: s}
	up := make(chan struct{}, 2)
	s.udp.NotifyStartedFunc = func() { up <- struct{}{} }
	s.tcp.NotifyStartedFunc = func() { up <- struct{}{} }
	go func() { _ = s.udp.ActivateAndServe() }()
	go func() { _ = s.tcp.ActivateAndServe() }()
	for i := 0; i < 2; i++ {
		select {
		case <-up:
		case <-time.After(5 * time.Second):
			s.Close()
			return nil, fmt.Errorf("dnstest: server on %s did not start", s.addr)
		}
	}
	return s, nil
}

// listen opens addr's UDP socket and a TCP listener on the same port. A
// free UDP port may be taken for TCP (another test's connection, say): with
// port 0 another port is tried, a few times, before that is an error.
func listen(addr string) (net.PacketConn, net.Listener, error) {
	_, port, _ := net.SplitHostPort(addr)
	tries := 1
	if port == "0" {
		tries = 20
	}
	var err error
	for range tries {
		pc, e := net.ListenPacket("udp", addr)
		if e != nil {
			return nil, nil, fmt.Errorf("dnstest: listen udp %s: %w", addr, e)
		}
		ln, e := net.Listen("tcp", pc.LocalAddr().String())
		if e == nil {
			return pc, ln, nil
		}
		pc.Close()
		err = fmt.Errorf("dnstest: listen tcp %s: %w", pc.LocalAddr(), e)
	}
	return nil, nil, err
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return s.addr }

// Set makes name resolve to ips (none: NXDOMAIN).
func (s *Server) Set(name string, ips ...string) {
	var parsed []net.IP
	for _, ip := range ips {
		if p := net.ParseIP(ip); p != nil {
			parsed = append(parsed, p)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(parsed) == 0 {
		delete(s.records, fqdn(name))
		return
	}
	s.records[fqdn(name)] = parsed
}

// Fail makes every answer SERVFAIL while on.
func (s *Server) Fail(on bool) { s.fail.Store(on) }

// Queries is how many queries the server has answered.
func (s *Server) Queries() int64 { return s.queries.Load() }

// Close stops the server.
func (s *Server) Close() {
	_ = s.udp.Shutdown()
	_ = s.tcp.Shutdown()
}

func fqdn(name string) string { return dns.Fqdn(strings.ToLower(name)) }

// ServeDNS answers one query.
func (s *Server) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	s.queries.Add(1)
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	if s.fail.Load() {
		m.Rcode = dns.RcodeServerFailure
		_ = w.WriteMsg(m)
		return
	}
	for _, q := range req.Question {
		s.mu.Lock()
		ips, ok := s.records[fqdn(q.Name)]
		s.mu.Unlock()
		if !ok {
			m.Rcode = dns.RcodeNameError
			continue
		}
		for _, ip := range ips {
			hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: 1}
			switch v4 := ip.To4(); {
			case q.Qtype == dns.TypeA && v4 != nil:
				hdr.Rrtype = dns.TypeA
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: v4})
			case q.Qtype == dns.TypeAAAA && v4 == nil:
				hdr.Rrtype = dns.TypeAAAA
				m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: ip})
			}
		}
	}
	_ = w.WriteMsg(m)
}
