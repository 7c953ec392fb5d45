package device

import (
	"reflect"
	"testing"
)

func TestAppendRunSegs(t *testing.T) {
	cases := []struct {
		name string
		runs []Run
		want []Seg
	}{
		{"none", nil, nil},
		{"one piece", []Run{{Addr: 100, Len: 8, N1: 1, N2: 1}}, []Seg{{100, 8}}},
		{"row of apart pieces", []Run{{Addr: 0, Len: 4, N1: 3, S1: 10, N2: 1}}, []Seg{{0, 4}, {10, 4}, {20, 4}}},
		{"grid", []Run{{Addr: 1000, Len: 2, N1: 2, S1: 100, N2: 2, S2: 8}},
			[]Seg{{1000, 2}, {1100, 2}, {1008, 2}, {1108, 2}}},
		{"contiguous pieces merge", []Run{{Addr: 0, Len: 4, N1: 4, S1: 4, N2: 2, S2: 16}}, []Seg{{0, 32}}},
		{"runs continuing each other merge", []Run{{Addr: 0, Len: 4, N1: 1, N2: 1}, {Addr: 4, Len: 4, N1: 2, S1: 8, N2: 1}},
			[]Seg{{0, 8}, {12, 4}}},
		{"empty dimensions add nothing", []Run{{Addr: 0, Len: 4, N1: 0, N2: 3}, {Addr: 8, Len: 4, N1: 2, N2: 0}, {Addr: 9, Len: 0, N1: 1, N2: 1}}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := AppendRunSegs(nil, tc.runs)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("AppendRunSegs = %v, want %v", got, tc.want)
			}
			var bytes uint64
			for _, r := range tc.runs {
				bytes += r.Bytes()
			}
			if SegsLen(got) != bytes {
				t.Errorf("segments hold %d B, runs %d B", SegsLen(got), bytes)
			}
		})
	}
}
