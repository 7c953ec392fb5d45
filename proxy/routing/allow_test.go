package routing

import "testing"

func TestAllowHost(t *testing.T) {
	allow := []string{"10.0.0.0/8", "fd00::/8", ".decode.stage.svc.cluster.local", "pods.local."}
	for _, tt := range []struct {
		host string
		want bool
	}{
		{"10.1.2.3", true},
		{"11.1.2.3", false},
		{"fd00::5", true},
		{"fe80::1", false},
		{"decode-0.decode.stage.svc.cluster.local", true},
		{"DECODE-0.Decode.Stage.svc.cluster.local.", true},
		{"decode.stage.svc.cluster.local", true},
		{"evildecode.stage.svc.cluster.local", false},
		{"decode.stage.svc.cluster.local.evil.com", false},
		{"a.pods.local", true},
		{"pods.local", true},
		{"xpods.local", false},
		{"", false},
	} {
		if got := allowHost(allow, tt.host); got != tt.want {
			t.Errorf("allowHost(%q): got %v, want %v", tt.host, got, tt.want)
		}
	}
	if allowHost(nil, "10.0.0.1") {
		t.Error("an empty allow list allowed an address")
	}
	// A name is never checked against CIDRs (nothing is resolved).
	if allowHost([]string{"127.0.0.0/8"}, "localhost") {
		t.Error("a host name was allowed by a CIDR range")
	}
}

func TestIsAddr(t *testing.T) {
	for _, tt := range []struct {
		s    string
		want bool
	}{
		{"10.0.0.5:7100", true},
		{"[fd00::1]:7100", true},
		{"decode-0.decode:7100", true},
		{"decode-0", false},
		{":7100", false},
		{"decode-0:", false},
		{"", false},
	} {
		if got := isAddr(tt.s); got != tt.want {
			t.Errorf("isAddr(%q): got %v, want %v", tt.s, got, tt.want)
		}
	}
}
