package config

import (
	"strings"
	"time"

	"github.com/stage-kv/stage/internal/spin"
)

// Spin is staging.read_spin: how long readers poll their socket after a
// frame before they sleep in a read, or SpinAuto.
type Spin time.Duration

// SpinAuto polls for spin.Window on machines of spin.MinCPUs or more and
// never below (Resolve). It is written "auto" in YAML and env vars, and it
// is the default: a 4 KiB push then lands in p50 30-33 us instead of 54-63
// on 2 x H200, while a 2-core machine keeps its cores for the copies.
const SpinAuto Spin = -1

// Resolve is the window to use: s itself, or for SpinAuto spin.Default's
// choice for this machine.
func (s Spin) Resolve() time.Duration { return s.resolve(spin.Default()) }

func (s Spin) resolve(auto time.Duration) time.Duration {
	if s == SpinAuto {
		return auto
	}
	return time.Duration(s)
}

func (s Spin) String() string {
	if s == SpinAuto {
		return "auto"
	}
	return time.Duration(s).String()
}

// toSpin reads "auto" or a duration (toDuration's rules). SpinAuto's own
// value is not accepted as a duration: -1ns is a mistake, not auto.
func toSpin(data any) (any, error) {
	if s, ok := data.(string); ok && strings.EqualFold(strings.TrimSpace(s), "auto") {
		return SpinAuto, nil
	}
	v, err := toDuration(data)
	if err != nil {
		return nil, badValue("must be auto or a duration like 100us, 0s")
	}
	if d := v.(time.Duration); d >= 0 {
		return Spin(d), nil
	}
	return nil, badValue("must be auto or a duration >= 0")
}
