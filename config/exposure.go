package config

import (
	"fmt"
	"net"
	"strings"
	"time"
)

// Bounds of limits.client_first_request_timeout.
const (
	MinClientFirstRequest = time.Second
	MaxClientFirstRequest = time.Hour
)

// loopback reports whether a listen address (host:port) takes connections
// from this machine only: an empty host or 0.0.0.0/:: is every interface;
// a name other than localhost is not trusted to resolve to loopback.
func loopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// exposure checks the settings that open the sidecar to the network
// without authentication: allow_insecure (no token) on an address that is
// not loopback needs allow_insecure_remote as well.
func (v *validator) exposure(c *Config) {
	s := c.Security
	if s.AllowInsecure && s.Token == "" && s.TokenFile == "" && !loopback(c.Listen) && !s.AllowInsecureRemote {
		v.add("security.allow_insecure", fmt.Sprintf("no token on listen address %q, which is not loopback: anyone who reaches it can read and write the engines' memory; set security.token (or token_file), listen on 127.0.0.1, or set security.allow_insecure_remote: true as well if you mean it", c.Listen))
	}
	l := c.Limits.ClientFirstRequestTimeout
	if l < MinClientFirstRequest || l > MaxClientFirstRequest {
		v.add("limits.client_first_request_timeout", fmt.Sprintf("must be %s..%s (got %s)", MinClientFirstRequest, MaxClientFirstRequest, l))
	}
}

// Warnings lists what a valid configuration allows that exposes the
// sidecar: peers without a token, a metrics page on every interface (it
// has no authentication), socket directories trusted in a shared parent.
// staged logs each at start; stagectl config check prints them.
func Warnings(c *Config) []Problem {
	var w []Problem
	s := c.Security
	if s.AllowInsecure && s.Token == "" && s.TokenFile == "" {
		if loopback(c.Listen) {
			w = append(w, Problem{"security.allow_insecure", fmt.Sprintf("peers connect without a token (listen %q, loopback): any local process can push to and pull from the engines' memory; for local tests only", c.Listen)})
		} else {
			w = append(w, Problem{"security.allow_insecure_remote", fmt.Sprintf("peers connect without a token on %q, which is not loopback: anyone who reaches it can read and write the engines' memory; set security.token", c.Listen)})
		}
	}
	if c.Metrics.Listen != "" && !loopback(c.Metrics.Listen) {
		w = append(w, Problem{"metrics.listen", fmt.Sprintf("%q is not loopback: /metrics (route, peer and region names, traffic) is served without authentication to anyone who reaches it; bind it to 127.0.0.1 or a pod IP that only the scraper reaches", c.Metrics.Listen)})
	}
	if s.TrustSocketParent {
		w = append(w, Problem{"security.trust_socket_parent", "socket directories are accepted inside directories others may write without the sticky bit; right only where every such writer is trusted (a pod's emptyDir)"})
	}
	return w
}
