package e2etest

import (
	"testing"

	"github.com/stage-kv/stage/wire"
)

// TestIdle: each figure that a leak moves makes a sidecar not idle.
func TestIdle(t *testing.T) {
	base := wire.Stats{Regions: 2, Mappings: 1, Goroutines: 40, FDs: 20}
	for _, tc := range []struct {
		name string
		edit func(*wire.Stats)
		want bool
	}{
		{"as at the baseline", func(*wire.Stats) {}, true},
		{"fewer goroutines and fds", func(s *wire.Stats) { s.Goroutines, s.FDs = 30, 10 }, true},
		{"a send slot in use", func(s *wire.Stats) { s.SendInUse = 1 }, false},
		{"a recv slot in use", func(s *wire.Stats) { s.RecvInUse = 1 }, false},
		{"a transfer active", func(s *wire.Stats) { s.Transfers = 1 }, false},
		{"a peer mapping open", func(s *wire.Stats) { s.PeerMappings = 1 }, false},
		{"a region left", func(s *wire.Stats) { s.Regions = 3 }, false},
		{"a region too few", func(s *wire.Stats) { s.Regions = 1 }, false},
		{"a mapping left", func(s *wire.Stats) { s.Mappings = 2 }, false},
		{"a goroutine more", func(s *wire.Stats) { s.Goroutines = 41 }, false},
		{"an fd more", func(s *wire.Stats) { s.FDs = 21 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := base
			tc.edit(&st)
			if got := idle(&st, &base); got != tc.want {
				t.Errorf("idle = %v, want %v", got, tc.want)
			}
		})
	}
}
