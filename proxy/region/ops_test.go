package region

import (
	"math"
	"strings"
	"testing"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/proxy/status"
	"github.com/stage-kv/stage/wire"
)

// fakeMapping is an allocation at a made-up address; nothing maps it.
type fakeMapping struct {
	base device.Addr
	size uint64
}

func (m fakeMapping) Base() device.Addr { return m.base }
func (m fakeMapping) Size() uint64      { return m.size }
func (m fakeMapping) Close() error      { return nil }

// testRegion is a region of n bytes at offset off inside an allocation at
// base, registered nowhere.
func testRegion(name string, base device.Addr, off, n uint64) *Region {
	return &Region{Name: name, Off: off, Len: n, imp: &importEntry{mapping: fakeMapping{base: base, size: off + n}}}
}

func TestCheckOps(t *testing.T) {
	const M = math.MaxUint64
	regions := []*Region{testRegion("a", 1<<20, 4096, 1000), testRegion("b", 1<<30, 0, 500)}
	remote := []string{"x", "y"}
	for _, tc := range []struct {
		name      string
		ops       []wire.LocalOp
		wantCode  wire.Code
		wantErr   string
		wantTotal uint64
		wantEnds  []uint64
	}{
		{"two regions", []wire.LocalOp{{Local: 0, Remote: 1, LocalOff: 0, RemoteOff: 100, Len: 1000}, {Local: 1, Remote: 0, LocalOff: 400, RemoteOff: 7, Len: 100}},
			0, "", 1100, []uint64{107, 1100}},
		{"highest end wins", []wire.LocalOp{{RemoteOff: 900, Len: 10}, {RemoteOff: 0, Len: 10}}, 0, "", 20, []uint64{910, 0}},
		{"local index", []wire.LocalOp{{Len: 1}, {Local: 2, Len: 1}}, wire.CodeBadRequest, "op 1 names region #2/#0 of 2/2", 0, nil},
		{"remote index", []wire.LocalOp{{Remote: 2, Len: 1}}, wire.CodeBadRequest, "op 0 names region #0/#2", 0, nil},
		{"past the end", []wire.LocalOp{{Local: 1, LocalOff: 400, Len: 101}}, wire.CodeOutOfRange, "op 0: region b: offset 400 + length 101 is past its end (500 B)", 0, nil},
		{"offset wraps", []wire.LocalOp{{LocalOff: M - 5, Len: 10}}, wire.CodeOutOfRange, "is past its end", 0, nil},
		{"length wraps", []wire.LocalOp{{LocalOff: 10, Len: M - 5}}, wire.CodeOutOfRange, "is past its end", 0, nil},
		{"empty op", []wire.LocalOp{{Len: 0}}, wire.CodeOutOfRange, "empty range", 0, nil},
		{"remote wraps", []wire.LocalOp{{RemoteOff: M - 5, Len: 10}}, wire.CodeOutOfRange, "remote offset 18446744073709551610 + length 10 overflows", 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &wire.Submit{RemoteNames: remote, Ops: tc.ops}
			for _, push := range []bool{false, true} {
				c, err := CheckOps(m, regions, push)
				if tc.wantErr != "" {
					if c != nil || status.Code(err) != tc.wantCode || !strings.Contains(err.Error(), tc.wantErr) {
						t.Fatalf("push=%v: got %v, %v; want %s naming %q", push, c, err, tc.wantCode, tc.wantErr)
					}
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if c.Total != tc.wantTotal || len(c.Ends) != len(tc.wantEnds) {
					t.Fatalf("got total %d, ends %v; want %d, %v", c.Total, c.Ends, tc.wantTotal, tc.wantEnds)
				}
				for i := range c.Ends {
					if c.Ends[i] != tc.wantEnds[i] {
						t.Fatalf("got ends %v, want %v", c.Ends, tc.wantEnds)
					}
				}
				if !push {
					if c.Plan != nil {
						t.Fatal("a pull got plan ops")
					}
					continue
				}
				if len(c.Plan) != len(tc.ops) {
					t.Fatalf("got %d plan ops, want %d", len(c.Plan), len(tc.ops))
				}
				for i, op := range tc.ops {
					want := regions[op.Local].Addr(op.LocalOff)
					if p := c.Plan[i]; p.Src != want || p.DstRegion != op.Remote || p.DstOff != op.RemoteOff || p.Len != op.Len {
						t.Errorf("plan op %d: got %+v, want source %#x, region %d, offset %d, %d B", i, p, want, op.Remote, op.RemoteOff, op.Len)
					}
				}
			}
		})
	}
}

func TestCheckOpsTotalOverflows(t *testing.T) {
	big := testRegion("big", 0, 0, math.MaxUint64)
	m := &wire.Submit{RemoteNames: []string{"x"}, Ops: []wire.LocalOp{{Len: 1 << 63}, {Len: 1 << 63}}}
	if c, err := CheckOps(m, []*Region{big}, true); c != nil || status.Code(err) != wire.CodeOutOfRange {
		t.Fatalf("got %v, %v; want an out-of-range error", c, err)
	}
}

// BenchmarkCheckOps65536Blocks: checking a push of 65,536 scattered
// 16 KiB blocks and converting it for the planner.
func BenchmarkCheckOps65536Blocks(b *testing.B) {
	const block, n = 16 << 10, 65536
	regions := []*Region{testRegion("kv", 1<<40, 0, n*block)}
	m := &wire.Submit{RemoteNames: []string{"kv"}, Ops: make([]wire.LocalOp, n)}
	for i := range m.Ops {
		m.Ops[i] = wire.LocalOp{LocalOff: uint64(i) * block, RemoteOff: uint64((i*40503)%n) * block, Len: block}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := CheckOps(m, regions, true); err != nil {
			b.Fatal(err)
		}
	}
}
