package wire

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func kvShape(widths ...uint32) KVShape {
	return KVShape{DType: 2, BlockSize: 128, Blocks: 4096, Heads: 8, HeadLo: 0, HeadHi: 4, Widths: widths, Flags: KVHeadOuter}
}

func kvSamples() []sample {
	req := KVRequest{Transfer: 1<<40 | 9, Tag: "req-7", Total: 3 << 20, Name: "kv", Layers: []uint32{0, 1, 31},
		Blocks: []uint32{7, 3, math.MaxUint32}, First: 5, Tokens: 300, HeadLo: 2, HeadHi: 4, Order: KVBlockMajor,
		Shape: kvShape(128, 128), PeerShape: kvShape(512, 64)}
	return []sample{
		{"RegisterKV", &RegisterKV{Req: 20, Name: "kv", Layout: KVLayout{DType: 2, BlockSize: 16, Blocks: 1000, Heads: 8, HeadLo: 4, HeadHi: 8,
			Parts: []KVPart{
				{Name: "k", Width: 128, Tensor: 0, Offset: 0, BlockStride: 1 << 16, SlotStride: 2048, HeadStride: 256},
				{Name: "v", Width: 128, Tensor: 1, Offset: 1 << 40, BlockStride: math.MaxUint64, SlotStride: 0, HeadStride: 1},
			}},
			Layers: [][]string{{"k0", "v0"}, {"k1", "v1"}}}},
		{"RegisterKVEmpty", &RegisterKV{Req: 21}},
		{"SubmitKV", &SubmitKV{Req: 22, Route: "decode", Peer: "decode-1", Dir: Push, Checksum: ChecksumOn, Tag: "req-9",
			Local: "kv", Remote: "kv-dec", Layers: []uint32{0, 1}, RemoteLayers: []uint32{4, 5},
			LocalBlocks: []uint32{1, 2, 3}, RemoteBlocks: []uint32{9, 8, 7, 6, 5, 4, 3, 2, 1, 0}, LocalFirst: 1, RemoteFirst: 2, Tokens: 100, HeadLo: 0, HeadHi: 8}},
		{"SubmitKVEmpty", &SubmitKV{Req: 23, Dir: Pull}},
		{"KVAnnounce", &KVAnnounce{req}},
		{"KVPull", &KVPull{req}},
		{"KVPullEmpty", &KVPull{KVRequest{Transfer: 3}}},
		{"KVInfoRequest", &KVInfoRequest{Seq: 5, Name: "kv"}},
		{"KVInfo", &KVInfo{Seq: 5, Name: "kv", Found: true, Layers: 32, Shape: kvShape(576)}},
		{"KVInfoMissing", &KVInfo{Seq: 6, Name: "nope"}},
	}
}

func TestKVDecodeRejects(t *testing.T) {
	sub := (&SubmitKV{Req: 1, Dir: Push, Layers: []uint32{0, 1}, RemoteLayers: []uint32{0}}).AppendBody(nil)
	info := (&KVInfo{Seq: 1, Found: true}).AppendBody(nil)
	info[8+2] = 2 // the Found byte
	parts := (&RegisterKV{Layout: KVLayout{Parts: make([]KVPart, MaxKVParts+1)}}).AppendBody(nil)
	badOrder := (&KVPull{KVRequest{Transfer: 1, Order: 2}}).AppendBody(nil)
	badFlags := (&KVInfo{Seq: 1, Shape: KVShape{Flags: 2}}).AppendBody(nil)
	blocks := body(nil).u64(1).u16(0).u16(0).u8(1).u8(0).u16(0).u16(0).u16(0).u32(0).u32(0).u32(MaxKVBlocks + 1)
	for _, tt := range []struct {
		name string
		t    Type
		b    []byte
		kind error
		want string
	}{
		{"remote layers", TypeSubmitKV, sub, ErrMalformed, "SubmitKV.RemoteLayers: 1 remote layers for 2 local ones"},
		{"found byte", TypeKVInfo, info, ErrMalformed, "KVInfo.Found: boolean byte is 2"},
		{"too many parts", TypeRegisterKV, parts, ErrTooLarge, "RegisterKV.Layout.Parts: count 9 exceeds limit 8"},
		{"too many blocks", TypeSubmitKV, blocks, ErrTooLarge, "SubmitKV.LocalBlocks: count 1048577 exceeds limit"},
		{"order", TypeKVPull, badOrder, ErrMalformed, "KVPull.Order: unknown order 2"},
		{"shape flags", TypeKVInfo, badFlags, ErrMalformed, "KVInfo.Shape.Flags: unknown flags 0x2"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Decode(tt.t, tt.b)
			if err == nil || m != nil {
				t.Fatalf("Decode = %v, %v; want an error", m, err)
			}
			if !errors.Is(err, tt.kind) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q, want %v containing %q", err, tt.kind, tt.want)
			}
		})
	}
}

// A block table of 65,536 ids, the largest request an engine makes in
// practice, round-trips.
func TestKVLargeBlockTable(t *testing.T) {
	ids := make([]uint32, 65536)
	for i := range ids {
		ids[i] = uint32(i * 7)
	}
	m := &SubmitKV{Req: 1, Dir: Push, Layers: []uint32{0}, LocalBlocks: ids, RemoteBlocks: ids[:100], Tokens: 1 << 20}
	got, err := Decode(TypeSubmitKV, m.AppendBody(nil))
	if err != nil {
		t.Fatal(err)
	}
	g := got.(*SubmitKV)
	if len(g.LocalBlocks) != len(ids) || g.LocalBlocks[65535] != 65535*7 || len(g.RemoteBlocks) != 100 {
		t.Fatalf("block tables %d/%d ids, last %d", len(g.LocalBlocks), len(g.RemoteBlocks), g.LocalBlocks[len(g.LocalBlocks)-1])
	}
}
