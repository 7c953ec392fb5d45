package config

import (
	"strings"
	"testing"
	"time"

	"github.com/stage-kv/stage/internal/spin"
)

// TestDepthFromYAMLAndEnv: staging.stream_depth takes auto (any case) or
// a whole number 0..64, from a file or an env var; anything else is an
// error that names the key.
func TestDepthFromYAMLAndEnv(t *testing.T) {
	tests := []struct {
		name, value string
		env         bool
		want        Depth
		wantErr     bool
	}{
		{name: "auto", value: "auto", want: DepthAuto},
		{name: "quoted AUTO", value: `"AUTO"`, want: DepthAuto},
		{name: "int", value: "3", want: 3},
		{name: "zero", value: "0", want: 0},
		{name: "whole float", value: "2.0", want: 2},
		{name: "max", value: "64", want: 64},
		{name: "env auto", value: "auto", env: true, want: DepthAuto},
		{name: "env int", value: "5", env: true, want: 5},
		{name: "minus one", value: "-1", wantErr: true},
		{name: "env minus one", value: "-1", env: true, wantErr: true},
		{name: "fraction", value: "1.5", wantErr: true},
		{name: "above max", value: "65", wantErr: true},
		{name: "word", value: "deep", wantErr: true},
		{name: "bool", value: "true", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cleanEnv(t)
			t.Setenv("STAGE_SECURITY_TOKEN", "x")
			file := writeFile(t, "staging:\n  stream_depth: "+tt.value+"\n")
			if tt.env {
				file = writeFile(t, "{}\n")
				t.Setenv("STAGE_STAGING_STREAM_DEPTH", tt.value)
			}
			c, err := Load(file, nil)
			if tt.wantErr {
				if err == nil || !strings.Contains(err.Error(), "staging.stream_depth") {
					t.Fatalf("got %v, want an error naming staging.stream_depth", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Staging.StreamDepth != tt.want {
				t.Errorf("got %s, want %s", c.Staging.StreamDepth, tt.want)
			}
		})
	}
}

func TestDepthResolve(t *testing.T) {
	for _, tc := range []struct {
		d      Depth
		splice bool
		want   int
	}{
		{DepthAuto, false, int(DepthWritev)},
		{DepthAuto, true, int(DepthSplice)},
		{0, true, 0},
		{2, false, 2},
		{7, true, 7},
	} {
		if got := tc.d.Resolve(tc.splice); got != tc.want {
			t.Errorf("%s.Resolve(splice %v) = %d, want %d", tc.d, tc.splice, got, tc.want)
		}
	}
}

// TestSpinFromYAMLAndEnv: staging.read_spin takes auto (the default),
// adaptive or a duration 0..10ms, from a file or an env var.
func TestSpinFromYAMLAndEnv(t *testing.T) {
	tests := []struct {
		name, value string
		env         bool
		want        Spin
		wantErr     bool
	}{
		{name: "default", want: SpinAuto},
		{name: "auto", value: "auto", want: SpinAuto},
		{name: "quoted AUTO", value: `"AUTO"`, want: SpinAuto},
		{name: "100us", value: "100us", want: Spin(100 * time.Microsecond)},
		{name: "off", value: "0s", want: 0},
		{name: "bare zero", value: "0", want: 0},
		{name: "env auto", value: "auto", env: true, want: SpinAuto},
		{name: "env 50us", value: "50us", env: true, want: Spin(50 * time.Microsecond)},
		{name: "adaptive", value: "adaptive", want: SpinAdaptive},
		{name: "env Adaptive", value: " Adaptive ", env: true, want: SpinAdaptive},
		{name: "adaptive's own number", value: "-2ns", wantErr: true},
		{name: "negative", value: "-1us", wantErr: true},
		{name: "env negative", value: "-1ns", env: true, wantErr: true},
		{name: "above max", value: "11ms", wantErr: true},
		{name: "no unit", value: "100", wantErr: true},
		{name: "word", value: "fast", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cleanEnv(t)
			t.Setenv("STAGE_SECURITY_TOKEN", "x")
			file := writeFile(t, "{}\n")
			if tt.value != "" {
				if tt.env {
					t.Setenv("STAGE_STAGING_READ_SPIN", tt.value)
				} else {
					file = writeFile(t, "staging:\n  read_spin: "+tt.value+"\n")
				}
			}
			c, err := Load(file, nil)
			if tt.wantErr {
				if err == nil || !strings.Contains(err.Error(), "staging.read_spin") {
					t.Fatalf("got %v, want an error naming staging.read_spin", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Staging.ReadSpin != tt.want {
				t.Errorf("got %s, want %s", c.Staging.ReadSpin, tt.want)
			}
		})
	}
}

func TestSpinResolve(t *testing.T) {
	auto := spin.Policy{Base: 77 * time.Microsecond, Max: 700 * time.Microsecond}
	for _, tc := range []struct {
		s    Spin
		want spin.Policy
	}{
		{SpinAuto, auto},
		{SpinAdaptive, spin.Auto()},
		{0, spin.Policy{}},
		{Spin(time.Millisecond), spin.Fixed(time.Millisecond)},
		{Spin(100 * time.Microsecond), spin.Fixed(100 * time.Microsecond)},
	} {
		if got := tc.s.resolve(auto); got != tc.want {
			t.Errorf("%s.resolve(%s) = %s, want %s", tc.s, auto, got, tc.want)
		}
	}
	for _, tc := range []struct {
		s    Spin
		want bool
	}{{SpinAuto, true}, {SpinAdaptive, true}, {0, true}, {Spin(MaxReadSpin), true}, {Spin(MaxReadSpin + 1), false}, {-3, false}} {
		if got := tc.s.Valid(); got != tc.want {
			t.Errorf("Spin(%d).Valid() = %v, want %v", int64(tc.s), got, tc.want)
		}
	}
}
