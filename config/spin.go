package config

import (
	"strings"
	"time"

	"github.com/stage-kv/stage/internal/spin"
)

// Spin is staging.read_spin: how long readers poll their socket after a
// frame before they sleep in a read (a fixed window), or SpinAuto, or
// SpinAdaptive.
type Spin time.Duration

// SpinAuto is the default, written "auto" in YAML and env vars: the
// adaptive window (SpinAdaptive) on machines of spin.MinCPUs or more and
// no polling below (Resolve), so a 2-core machine keeps its cores for the
// copies.
const SpinAuto Spin = -1

// SpinAdaptive, written "adaptive", is the adaptive window on any machine:
// each reader polls spin.Window (100us) after a frame, and up to
// spin.MaxWindow (1ms) when the frames it waited for came at a steady pace
// longer than that (spin.Adaptive). A 4 KiB push checked after each (a
// pace of 150-300 us) then keeps its reader awake, which a fixed 100us
// does not; idle, each reader polls once for at most 1 ms and sleeps.
const SpinAdaptive Spin = -2

// Resolve is the policy to use: a fixed window of s itself (0: never
// poll), the adaptive one, or for SpinAuto spin.DefaultPolicy's choice for
// this machine.
func (s Spin) Resolve() spin.Policy { return s.resolve(spin.DefaultPolicy()) }

func (s Spin) resolve(auto spin.Policy) spin.Policy {
	switch s {
	case SpinAuto:
		return auto
	case SpinAdaptive:
		return spin.Auto()
	}
	return spin.Fixed(time.Duration(s))
}

func (s Spin) String() string {
	switch s {
	case SpinAuto:
		return "auto"
	case SpinAdaptive:
		return "adaptive"
	}
	return time.Duration(s).String()
}

// ParseSpin reads "auto", "adaptive" or a duration >= 0 (toDuration's
// rules). The special values' own numbers are not accepted as durations:
// -1ns is a mistake, not auto.
func ParseSpin(data any) (Spin, error) {
	if s, ok := data.(string); ok {
		switch strings.ToLower(strings.TrimSpace(s)) {
		case "auto":
			return SpinAuto, nil
		case "adaptive":
			return SpinAdaptive, nil
		}
	}
	v, err := toDuration(data)
	if err != nil {
		return 0, badValue("must be auto, adaptive or a duration like 100us, 0s")
	}
	if d := v.(time.Duration); d >= 0 {
		return Spin(d), nil
	}
	return 0, badValue("must be auto, adaptive or a duration >= 0")
}

func toSpin(data any) (any, error) { return ParseSpin(data) }

// Set makes *Spin a command-line flag value (stagectl bench --spin): the
// same words as staging.read_spin.
func (s *Spin) Set(v string) error {
	p, err := ParseSpin(v)
	if err != nil {
		return err
	}
	*s = p
	return nil
}

// Type names the flag's value in help.
func (*Spin) Type() string { return "auto|adaptive|duration" }

// Valid reports whether s is auto, adaptive or a window of 0..MaxReadSpin.
func (s Spin) Valid() bool {
	return s == SpinAuto || s == SpinAdaptive || (s >= 0 && time.Duration(s) <= MaxReadSpin)
}
