package main

import (
	"strconv"
	"testing"
)

// FuzzParseSize: any text either fails or gives a size >= 0 that reads
// back the same in bytes.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"4MiB", "64K", "1048576", "0", "-1", "1GiB", "99999999999GiB", "B", " 3 MiB", "4TiB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := parseSize(s)
		if err != nil {
			return
		}
		if v < 0 {
			t.Fatalf("%q gave %d", s, v)
		}
		if w, err := parseSize(strconv.FormatInt(v, 10)); err != nil || w != v {
			t.Fatalf("%q gave %d, which reads back as %d, %v", s, v, w, err)
		}
	})
}

// FuzzParseHostStat: any text either fails or gives softirq <= busy, and
// seconds since a zero reading in the same order.
func FuzzParseHostStat(f *testing.F) {
	for _, s := range []string{"cpu  100 20 300 5000 70 8 90 11 0 0\n", "cpu 1 2 3", "", "cpu 18446744073709551615 1 1 1 1 1 1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h, err := parseHostStat(s)
		if err != nil {
			return
		}
		busy, soft := h.since(hostStat{})
		if h.busy < h.softirq || soft < 0 || busy < soft {
			t.Fatalf("%q gave %+v: %v s busy, %v s softirq", s, h, busy, soft)
		}
	})
}
