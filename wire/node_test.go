package wire

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func nodeSamples() []sample {
	return []sample{
		{"NodeInfo", &NodeInfo{Socket: "decode-1f2e.sock", Device: "cuda:1"}},
		{"NodeInfoEmpty", &NodeInfo{}},
		{"Revoke", &Revoke{RegionID: 1 << 40}},
		{"NodeHello", &NodeHello{SessionID: sid(5), Proof: nonce(60)}},
		{"HandleRequest", &HandleRequest{Transfer: 9, Dir: Push, Tag: "req-1", Regions: []string{"kv/0", "kv/1"}}},
		{"RegionHandleIPC", &RegionHandle{Transfer: 9, Index: 1, RegionID: 33, Kind: 2, Access: AccessRemoteWrite,
			AllocKey: "cuda-ipc:00ff", AllocSize: 1 << 30, Offset: 4096, Length: 1 << 20, Device: "cuda:1", Raw: seq(64, 3)}},
		{"RegionHandleFD", &RegionHandle{Transfer: 9, RegionID: 34, Kind: 1, Access: AccessAll,
			AllocKey: "memfd:1:2", AllocSize: 100, Offset: 100, Length: 0, Device: "hostmem:0"}},
		{"DirectDone", &DirectDone{Transfer: 9, Bytes: 4 << 30}},
		{"ShmRing", &ShmRing{Slots: 4, SlotSize: 4 << 20}},
		{"ShmChunk", &ShmChunk{Transfer: 10, Slot: 3, Index: 7, Count: 8, PayloadLen: 5,
			Segs: []ChunkSeg{{Region: 0, Len: 2, Offset: 1 << 33}, {Region: 1, Len: 3, Offset: 0}}}},
		{"ShmChunkEmpty", &ShmChunk{Transfer: 10}},
		{"ShmLanded", &ShmLanded{Transfer: 10, Slot: 3, Index: 7, Code: CodeDevice, Message: "scatter failed"}},
		{"LinkWake", &LinkWake{}},
	}
}

// TestNodeGolden pins the byte layout of the same-node frames that
// docs/PROTOCOL.md section 11 spells out.
func TestNodeGolden(t *testing.T) {
	tests := []struct {
		name string
		m    Msg
		want []byte
	}{
		{"NodeInfo", &NodeInfo{Socket: "a", Device: "cuda:1"},
			body(nil).u16(1).raw('a').u16(6).raw([]byte("cuda:1")...)},
		{"Revoke", &Revoke{RegionID: 0x0102}, body(nil).u64(0x0102)},
		{"HandleRequest", &HandleRequest{Transfer: 3, Dir: Pull, Tag: "t", Regions: []string{"r"}},
			body(nil).u64(3).u8(2).str("t").u32(1).str("r")},
		{"RegionHandle", &RegionHandle{Transfer: 3, Index: 0, RegionID: 7, Kind: 1, Access: AccessRemoteWrite,
			AllocKey: "k", AllocSize: 64, Offset: 16, Length: 32, Device: "d"},
			body(nil).u64(3).u32(0).u64(7).u8(1).u8(4).str("k").u64(64).u64(16).u64(32).str("d").u16(0)},
		{"DirectDone", &DirectDone{Transfer: 3, Bytes: 99}, body(nil).u64(3).u64(99)},
		{"ShmRing", &ShmRing{Slots: 4, SlotSize: 1 << 20}, body(nil).u32(4).u32(1 << 20)},
		{"ShmChunk", &ShmChunk{Transfer: 3, Slot: 1, Index: 2, Count: 4, PayloadLen: 8, Segs: []ChunkSeg{{Region: 1, Len: 8, Offset: 64}}},
			body(nil).u64(3).u32(1).u32(2).u32(4).u32(8).u32(1).u32(1).u32(8).u64(64)},
		{"ShmLanded", &ShmLanded{Transfer: 3, Slot: 1, Index: 2, Code: CodeOK}, body(nil).u64(3).u32(1).u32(2).u16(0).u16(0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.m.AppendBody(nil); !bytes.Equal(got, tt.want) {
				t.Fatalf("body: got %x, want %x", got, tt.want)
			}
		})
	}
	fr := AppendFrame(nil, &Revoke{RegionID: 1}, false, 0)
	want := []byte{0x53, 0x47, 1, 19, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0}
	if !bytes.Equal(fr, want) {
		t.Fatalf("Revoke frame: got %x, want %x", fr, want)
	}
}

func TestNodeDecodeErrors(t *testing.T) {
	tests := []struct {
		name string
		t    Type
		b    []byte
		err  error
		msg  string
	}{
		{"handle past allocation", TypeRegionHandle,
			body(nil).u64(3).u32(0).u64(7).u8(1).u8(4).str("k").u64(64).u64(48).u64(17).str("d").u16(0), ErrMalformed, "past the allocation"},
		{"handle offset overflow", TypeRegionHandle,
			body(nil).u64(3).u32(0).u64(7).u8(1).u8(4).str("k").u64(64).u64(1<<64 - 1).u64(2).str("d").u16(0), ErrMalformed, "past the allocation"},
		{"handle raw too long", TypeRegionHandle,
			body(nil).u64(3).u32(0).u64(7).u8(2).u8(4).str("k").u64(64).u64(0).u64(1).str("d").u16(MaxHandleBytes + 1), ErrTooLarge, "Raw"},
		{"handle bad access", TypeRegionHandle,
			body(nil).u64(3).u32(0).u64(7).u8(2).u8(0x10).str("k").u64(64).u64(0).u64(1).str("d").u16(0), ErrMalformed, "Access"},
		{"request bad dir", TypeHandleRequest, body(nil).u64(1).u8(3).str("").u32(0), ErrMalformed, "Dir"},
		{"request count beyond body", TypeHandleRequest, body(nil).u64(1).u8(1).str("").u32(1000), ErrMalformed, "count 1000"},
		{"chunk segs too many", TypeShmChunk, body(nil).u64(1).u32(0).u32(0).u32(1).u32(0).u32(MaxChunkSegs + 1), ErrTooLarge, "Segs"},
		{"chunk segs sum", TypeShmChunk, body(nil).u64(1).u32(0).u32(0).u32(1).u32(9).u32(1).u32(0).u32(8).u64(0), ErrMalformed, "add up to 8"},
		{"chunk seg overflow", TypeShmChunk, body(nil).u64(1).u32(0).u32(0).u32(1).u32(8).u32(1).u32(0).u32(8).u64(1<<64 - 4), ErrOverflow, "offset"},
		{"hello short", TypeNodeHello, body(nil).zeros(47), ErrMalformed, "Proof"},
		{"done trailing", TypeDirectDone, body(nil).u64(1).u64(2).u8(0), ErrMalformed, "trailing"},
		{"wake with a body", TypeLinkWake, body(nil).u8(0), ErrMalformed, "trailing"},
		{"info name too long", TypeNodeInfo, body(nil).str(strings.Repeat("x", MaxName+1)).str(""), ErrTooLarge, "Socket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Decode(tt.t, tt.b)
			if m != nil || !errors.Is(err, tt.err) {
				t.Fatalf("got %#v, %v; want nil, %v", m, err, tt.err)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("error %q does not mention %q", err, tt.msg)
			}
		})
	}
}

func TestNodeHeaderFD(t *testing.T) {
	for _, typ := range []Type{TypeRegionHandle, TypeShmRing} {
		h, err := ParseHeader(AppendHeader(nil, Header{Version: 1, Type: typ, Flags: FlagFD, Length: 8}))
		if err != nil || h.Flags&FlagFD == 0 {
			t.Fatalf("%s with FlagFD: got %+v, %v; want accepted", typ, h, err)
		}
	}
	if _, err := ParseHeader(AppendHeader(nil, Header{Version: 1, Type: TypeRevoke, Flags: FlagFD, Length: 8})); !errors.Is(err, ErrMalformed) {
		t.Fatalf("Revoke with FlagFD: got %v, want ErrMalformed (a peer frame)", err)
	}
}

// FuzzNodeDecode is FuzzDecode restricted to the same-node frames, seeded
// with their samples and golden bodies.
func FuzzNodeDecode(f *testing.F) {
	for _, s := range nodeSamples() {
		f.Add(uint8(s.m.Type()), s.m.AppendBody(nil))
	}
	f.Add(uint8(TypeShmChunk), []byte(body(nil).u64(1).u32(0).u32(0).u32(1).u32(9).u32(1).u32(0).u32(8).u64(0)))
	f.Add(uint8(TypeRegionHandle), []byte(body(nil).u64(3).u32(0).u64(7).u8(1).u8(4).str("k").u64(64).u64(48).u64(17).str("d").u16(0)))
	types := []Type{TypeNodeInfo, TypeRevoke, TypeNodeHello, TypeHandleRequest, TypeRegionHandle, TypeDirectDone, TypeShmRing, TypeShmChunk, TypeShmLanded, TypeLinkWake}
	f.Fuzz(func(t *testing.T, typ uint8, b []byte) {
		tt := types[int(typ)%len(types)]
		m, err := Decode(tt, b)
		if err != nil {
			if m != nil {
				t.Fatalf("got %#v with error %v, want nil", m, err)
			}
			if !sentinel(err) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		re := m.AppendBody(nil)
		if !bytes.Equal(re, b) {
			t.Fatalf("re-encoded body differs:\n got %x\nwant %x", re, b)
		}
		m2, err := Decode(tt, re)
		if err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("re-decode: got %#v, %v; want %#v", m2, err, m)
		}
	})
}
