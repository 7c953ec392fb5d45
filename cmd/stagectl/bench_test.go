package main

import (
	"bytes"
	"math"
	"strings"
	"testing"
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
