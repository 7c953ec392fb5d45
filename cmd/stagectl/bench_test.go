package main

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"
)

func TestMeanRaw(t *testing.T) {
	m := meanRaw([]*RawResult{
		{Streams: 1, GBps: 2, CPUSecPerGB: 0.4, Runs: 1, MinGBps: 2, MaxGBps: 2},
		{Streams: 1, GBps: 4, CPUSecPerGB: 0.2, Runs: 1, MinGBps: 4, MaxGBps: 4},
		{Streams: 1, GBps: 3, CPUSecPerGB: 0.3, Runs: 1, MinGBps: 3, MaxGBps: 3},
	})
	if m.Runs != 3 || math.Abs(m.GBps-3) > 1e-9 || math.Abs(m.CPUSecPerGB-0.3) > 1e-9 || m.MinGBps != 2 || m.MaxGBps != 4 {
		t.Fatalf("mean of 2, 4, 3 GB/s: %+v", m)
	}
}

// Each row of a sweep is a share of the raw TCP measured beside it; a
// single row falls back to the one raw figure.
func TestBenchTableShares(t *testing.T) {
	rs := []*BenchResult{
		{Block: 4 << 10, Pattern: "blocks", Dir: "push", GBps: 1, RawBeside: 4},
		{Block: 1 << 20, Pattern: "blocks", Dir: "push", GBps: 1, RawBeside: 2},
		{Block: 4 << 20, Pattern: "blocks", Dir: "push", GBps: 1},
	}
	var b bytes.Buffer
	printBenchTable(&b, rs, &RawResult{Streams: 1, GBps: 3, Runs: 2, MinGBps: 2, MaxGBps: 4})
	out := b.String()
	for _, want := range []string{"25%", "50%", "33%", "measured after each row", "mean 3.000 GB/s, 2.000-4.000"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// TestDemoMeaning: the line under the demo's table names what its figures
// are of, and never calls a CUDA run emulated or a same-node run TCP.
func TestDemoMeaning(t *testing.T) {
	host, gpu := engineDevice{kind: "hostmem"}, engineDevice{kind: "cuda", ordinal: 1}
	for _, tc := range []struct {
		name        string
		o           demoOpts
		want, want2 string
		not         string
	}{
		{"hostmem over tcp", demoOpts{pdev: host, ddev: host, transport: "tcp"}, "emulated devices (hostmem)", "loopback TCP", "cuda"},
		{"cuda", demoOpts{pdev: gpu, ddev: host, transport: "tcp"}, "devices cuda:1 -> hostmem:0", "loopback TCP", "emulated"},
		{"same node", demoOpts{pdev: host, ddev: host, transport: "auto"}, "emulated devices", `route transport "auto"`, "TCP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := demoMeaning(tc.o)
			if !strings.Contains(got, tc.want) || !strings.Contains(got, tc.want2) || strings.Contains(got, tc.not) {
				t.Errorf("%q: want %q and %q, not %q", got, tc.want, tc.want2, tc.not)
			}
		})
	}
}

func TestPercentileUs(t *testing.T) {
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Microsecond
	}
	for _, tc := range []struct {
		name string
		lat  []time.Duration
		p    float64
		want float64
	}{
		{"none", nil, 0.5, 0},
		{"one", []time.Duration{7 * time.Microsecond}, 0.99, 7},
		{"p50 of 1..100 us", hundred, 0.5, 50},
		{"p99 of 1..100 us", hundred, 0.99, 99},
		{"max of 1..100 us", hundred, 1, 100},
		{"p0 is the least", hundred, 0, 1},
	} {
		if got := percentileUs(tc.lat, tc.p); got != tc.want {
			t.Errorf("%s: got %v us, want %v", tc.name, got, tc.want)
		}
	}
}
