package main

import (
	"bytes"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPlotSweep: each format plotSweep writes is what its name says, with
// the sweep's block sizes and the raw ceiling in it where the format keeps
// text; a PNG is 900 x 540 and not blank.
func TestPlotSweep(t *testing.T) {
	rs := []*BenchResult{{Block: 4 << 10, GBps: 0.4, Devices: "hostmem:0 -> hostmem:0"}, {Block: 1 << 20, GBps: 1.9, Devices: "hostmem:0 -> hostmem:0"},
		{Block: 64 << 20, GBps: 2.1, Devices: "hostmem:0 -> hostmem:0"}}
	raw := &RawResult{Streams: 1, GBps: 2.6}
	dir := t.TempDir()
	for _, tc := range []struct {
		name  string
		rs    []*BenchResult
		raw   *RawResult
		check func(t *testing.T, b []byte)
	}{
		{"sweep.png", rs, raw, checkPNG},
		{"no-extension", rs, raw, checkPNG},
		{"one-row.png", rs[1:2], raw, checkPNG},
		{"no-raw.png", rs, nil, checkPNG},
		{"sweep.svg", rs, raw, func(t *testing.T, b []byte) {
			for _, want := range []string{"<svg", "4KiB", "1MiB", "64MiB", "raw TCP, 1 streams: 2.60 GB/s", "stage push (hostmem:0 -&gt; hostmem:0)", "title"} {
				if !strings.Contains(string(b), want) {
					t.Errorf("the SVG lacks %q", want)
				}
			}
		}},
		{"sweep.pdf", rs, raw, func(t *testing.T, b []byte) {
			if !bytes.HasPrefix(b, []byte("%PDF-")) {
				t.Errorf("not a PDF: %q", b[:min(len(b), 16)])
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name)
			if err := plotSweep(path, tc.rs, tc.raw, "title"); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, b)
		})
	}
	if err := plotSweep(filepath.Join(dir, "empty.png"), nil, raw, "title"); err == nil {
		t.Error("plotting no results succeeded")
	}
}

func checkPNG(t *testing.T, b []byte) {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if got := img.Bounds(); got != image.Rect(0, 0, 900, 540) {
		t.Errorf("PNG is %v, want 900 x 540", got)
	}
	colors := map[[4]uint32]bool{}
	for y := 0; y < 540; y += 3 {
		for x := 0; x < 900; x += 3 {
			r, g, bl, a := img.At(x, y).RGBA()
			colors[[4]uint32{r, g, bl, a}] = true
		}
	}
	if len(colors) < 3 {
		t.Errorf("PNG has %d colours: blank", len(colors))
	}
}
