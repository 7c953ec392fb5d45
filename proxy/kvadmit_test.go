package proxy

import (
	"context"
	"strings"
	"testing"

	stagecl "github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/kvlayout"
	"github.com/stage-kv/stage/kvsim"
	"github.com/stage-kv/stage/proxy/region"
	"github.com/stage-kv/stage/wire"
)

// kvAdmitTokens is how many tokens the fixture's requests move.
const kvAdmitTokens = 20

// kvAdmitFixture is a sidecar with one KV cache "kv" (8 blocks of 16
// tokens, 8 heads) registered by a client, and a session a peer's KV
// requests come on.
type kvAdmitFixture struct {
	s     *testSidecar
	cl    *stagecl.Client
	p     kvlayout.Params
	c     *kvCache
	total uint64 // bytes of kvAdmitTokens tokens of one layer
	ss    *session
}

func newKVAdmitFixture(t *testing.T, name string) *kvAdmitFixture {
	t.Helper()
	s := startTestSidecar(t, name, config.TLS{}, "")
	cl, err := stagecl.Dial(s.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	p := kvlayout.Params{DType: kvlayout.BF16, Blocks: 8, BlockSize: 16, Heads: 8, HeadHi: 8, HeadSize: 64}
	k, err := kvsim.NewKV("kv", "vllm-flash", p, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.Close() })
	if err := k.Register(context.Background(), cl, wire.AccessAll); err != nil {
		t.Fatal(err)
	}
	c := s.kv.get("kv")
	ss := testSession(true) // we dialed: the peer's transfer ids are even
	ss.s, ss.link = s.Server, &counters{}
	total := uint64(kvAdmitTokens) * uint64(p.Heads) * c.layout.RowWidth() * c.layout.DType.Size()
	return &kvAdmitFixture{s: s, cl: cl, p: p, c: c, total: total, ss: ss}
}

// request is a peer's KV request for the fixture's cache: layer 0, the
// tokens in table, under key.
func (f *kvAdmitFixture) request(id uint64, table []uint32, key []byte) *wire.KVRequest {
	c := f.c
	return &wire.KVRequest{Transfer: id, Total: f.total, Name: "kv", Layers: []uint32{0}, Blocks: table, Tokens: kvAdmitTokens, Key: key,
		HeadLo: 0, HeadHi: f.p.Heads, Order: uint8(kvOrder(&c.layout, &c.shape, 0, 0)), Shape: c.shape, PeerShape: c.shape}
}

// TestPeerKVTableRepeats: a peer's KV request that would write two token
// ranges into one of our blocks (a push into us) is refused, naming the
// block and its positions; a pull from us may read a block twice.
func TestPeerKVTableRepeats(t *testing.T) {
	noLeaks(t)
	f := newKVAdmitFixture(t, "kvadmit")
	s, ss := f.s, f.ss
	for _, tc := range []struct {
		name  string
		want  wire.Access
		table []uint32
		err   string // "" accepted
	}{
		{"push into two distinct blocks", wire.AccessRemoteWrite, []uint32{2, 3}, ""},
		{"push into one block twice", wire.AccessRemoteWrite, []uint32{2, 2}, "block_table[0] and block_table[1] are both block 2"},
		{"push, a repeat past the tokens' blocks", wire.AccessRemoteWrite, []uint32{2, 3, 2}, ""},
		{"pull reading one block twice", wire.AccessRemoteRead, []uint32{2, 2}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ks, err := s.kv.admit(ss, f.request(2, tc.table, nil), tc.want)
			if tc.err == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				region.ReleaseAll(ks.regions)
				return
			}
			if err == nil {
				region.ReleaseAll(ks.regions)
				t.Fatalf("accepted; want a refusal naming %q", tc.err)
			}
			if errCode(err) != wire.CodeBadRequest || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("refused with %v (%v); want %v naming %q", errCode(err), err, wire.CodeBadRequest, tc.err)
			}
		})
	}
}
