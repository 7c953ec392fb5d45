package main

import (
	"strings"
	"testing"

	"github.com/stage-kv/stage/kvlayout"
	"github.com/stage-kv/stage/kvsim"
)

// checkLanded passes a destination holding exactly the moved rows, and
// fails one that misses them or has a byte changed outside them.
func TestCheckLanded(t *testing.T) {
	p := kvlayout.Params{DType: kvlayout.BF16, Blocks: 8, BlockSize: 16, Heads: 2, HeadHi: 2, HeadSize: 8}
	m := kvsim.KVMove{Layers: []int{0, 1}, SrcTable: []uint32{5, 2, 7}, DstTable: []uint32{1, 6, 3}, Tokens: 40}
	for _, tc := range []struct {
		name  string
		spoil func(land []byte) // after the rows landed
		land  bool
		want  string // "" for no error
	}{
		{"landed", func([]byte) {}, true, ""},
		{"not landed", func([]byte) {}, false, "destination byte"},
		{"a byte outside the rows", func(b []byte) { b[0] ^= 1 }, true, "destination byte 0 "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, err := kvsim.NewKV("src", "vllm-hnd", p, 2)
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			dst, err := kvsim.NewKV("dst", "vllm-flash", p, 2)
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Close()
			if err := src.Fill(3); err != nil {
				t.Fatal(err)
			}
			if err := dst.Poison(0xAB); err != nil {
				t.Fatal(err)
			}
			before, err := dst.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			if tc.land { // what a transfer would leave: the rows moved
				land := append([]byte(nil), before...)
				if err := kvsim.Expect(src, dst, land, m); err != nil {
					t.Fatal(err)
				}
				tc.spoil(land)
				if err := dst.Memory().WriteAt(land, 0); err != nil {
					t.Fatal(err)
				}
			}
			err = checkLanded("test", dst, before, []*kvsim.KV{src}, m)
			if tc.want == "" && err != nil {
				t.Fatalf("got %v, want no error", err)
			}
			if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}
