package config

import (
	"strings"
	"testing"
	"time"
)

// Issue 35, item 5: settings that open the sidecar without authentication
// are refused (allow_insecure beyond loopback without the second switch)
// or warned about (no token, metrics on every interface).
func TestExposure(t *testing.T) {
	for _, tc := range []struct {
		name    string
		set     func(c *Config)
		problem string   // a Validate problem's key; "" none
		warn    []string // Warnings' keys, in order
	}{
		{"defaults", func(c *Config) {}, "", nil},
		{"insecure on loopback", func(c *Config) { c.Security.AllowInsecure = true }, "", []string{"security.allow_insecure"}},
		{"insecure on localhost", func(c *Config) { c.Security.AllowInsecure, c.Listen = true, "localhost:7100" }, "", []string{"security.allow_insecure"}},
		{"insecure on ::1", func(c *Config) { c.Security.AllowInsecure, c.Listen = true, "[::1]:7100" }, "", []string{"security.allow_insecure"}},
		{"insecure on every interface", func(c *Config) { c.Security.AllowInsecure, c.Listen = true, "0.0.0.0:7100" }, "security.allow_insecure", nil},
		{"insecure on :7100", func(c *Config) { c.Security.AllowInsecure, c.Listen = true, ":7100" }, "security.allow_insecure", nil},
		{"insecure on a name", func(c *Config) { c.Security.AllowInsecure, c.Listen = true, "node1.example:7100" }, "security.allow_insecure", nil},
		{"insecure remote, said twice", func(c *Config) {
			c.Security.AllowInsecure, c.Security.AllowInsecureRemote, c.Listen = true, true, "0.0.0.0:7100"
		}, "", []string{"security.allow_insecure_remote"}},
		{"token on every interface", func(c *Config) { c.Security.AllowInsecure, c.Security.Token, c.Listen = true, "t", ":7100" }, "", nil},
		{"metrics on every interface", func(c *Config) { c.Metrics.Listen = ":7101" }, "", []string{"metrics.listen"}},
		{"metrics on loopback", func(c *Config) { c.Metrics.Listen = "127.0.0.1:7101" }, "", nil},
		{"trusted socket parent", func(c *Config) { c.Security.TrustSocketParent = true }, "", []string{"security.trust_socket_parent"}},
		{"first request timeout 0", func(c *Config) { c.Limits.ClientFirstRequestTimeout = 0 }, "limits.client_first_request_timeout", nil},
		{"first request timeout 2h", func(c *Config) { c.Limits.ClientFirstRequestTimeout = 2 * time.Hour }, "limits.client_first_request_timeout", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			if !strings.HasPrefix(tc.name, "insecure") {
				c.Security.Token = "t" // the insecure rows run without one
			}
			tc.set(c)
			err := Validate(c)
			switch {
			case tc.problem == "" && err != nil:
				t.Fatalf("Validate: %v, want nil", err)
			case tc.problem != "":
				ve, ok := err.(*ValidationError)
				if !ok || len(ve.Problems) != 1 || !ve.Has(tc.problem) {
					t.Fatalf("Validate: %v, want one problem with %s", err, tc.problem)
				}
				return
			}
			var got []string
			for _, w := range Warnings(c) {
				got = append(got, w.Key)
				if w.Msg == "" {
					t.Errorf("warning %s without a message", w.Key)
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.warn, ",") {
				t.Errorf("warnings %v, want %v", got, tc.warn)
			}
		})
	}
}

func TestExposureMessages(t *testing.T) {
	c := Default()
	c.Security.AllowInsecure, c.Listen = true, "0.0.0.0:7100"
	err := Validate(c)
	if err == nil || !strings.Contains(err.Error(), `"0.0.0.0:7100", which is not loopback`) || !strings.Contains(err.Error(), "security.allow_insecure_remote: true") {
		t.Errorf("got %v, want it to name the address and the switch that allows it", err)
	}
}
