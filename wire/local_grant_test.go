package wire

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"
)

var testKey = []byte("0123456789abcdef")

func grantSamples() []sample {
	req := KVRequest{Transfer: 8, Tag: "r|d0/1", Total: 1 << 20, Name: "kv", Layers: []uint32{0}, Blocks: []uint32{4, 2},
		Tokens: 20, Shape: kvShape(128), PeerShape: kvShape(128), Key: testKey}
	return []sample{
		{"Grant", &Grant{Req: 40, Cache: "kv-tp0", Key: testKey, TTLMs: 120_000, Uses: 8, Blocks: []uint32{3, 9, math.MaxUint32}}},
		{"GrantWrite", &Grant{Req: 41, Cache: "kv", Key: bytes.Repeat([]byte{0xfe}, MaxGrantKey), Write: true, TTLMs: MaxGrantTTLMs}},
		{"RevokeGrant", &RevokeGrant{Req: 42, Cache: "kv-tp0", Key: testKey}},
		{"KVPullKey", &KVPull{req}},
		{"KVAnnounceKey", &KVAnnounce{req}},
		{"SubmitKVKey", &SubmitKV{Req: 43, Dir: Pull, Local: "a", Remote: "b", Tokens: 1, Key: testKey}},
	}
}

func keyOf(m Msg) []byte {
	switch m := m.(type) {
	case *KVPull:
		return m.Key
	case *KVAnnounce:
		return m.Key
	case *SubmitKV:
		return m.Key
	}
	return nil
}

func TestGrantGolden(t *testing.T) {
	got := AppendFrame(nil, &Grant{Req: 1, Cache: "c", Key: testKey, TTLMs: 1000, Uses: 2, Blocks: []uint32{5}}, false, 0)
	want := hexBytes(
		"SG", 1, 158, 0, 0, 0, 0, 44, 0, 0, 0, 0, 0, 0, 0, // header: type 158, length 44
		1, 0, 0, 0, 0, 0, 0, 0, // Req
		1, 0, "c", // Cache
		16, 0, "0123456789abcdef", // Key
		0,             // Write
		0xe8, 3, 0, 0, // TTLMs 1000
		2, 0, // Uses
		1, 0, 0, 0, 5, 0, 0, 0, // Blocks [5]
	)
	if !bytes.Equal(got, want) {
		t.Fatalf("Grant frame:\n got %x\nwant %x", got, want)
	}
	got = AppendFrame(nil, &RevokeGrant{Req: 2, Cache: "c", Key: testKey}, false, 0)
	want = hexBytes(
		"SG", 1, 159, 0, 0, 0, 0, 29, 0, 0, 0, 0, 0, 0, 0,
		2, 0, 0, 0, 0, 0, 0, 0,
		1, 0, "c",
		16, 0, "0123456789abcdef",
	)
	if !bytes.Equal(got, want) {
		t.Fatalf("RevokeGrant frame:\n got %x\nwant %x", got, want)
	}
}

func TestGrantRefused(t *testing.T) {
	g := func(m Grant) []byte { return m.AppendBody(nil) }
	ok := Grant{Req: 1, Cache: "c", Key: testKey, TTLMs: 1, Uses: 1}
	short, long, noTTL, longTTL, write, noUses, manyUses, badBool := ok, ok, ok, ok, ok, ok, ok, ok
	short.Key = testKey[:MinGrantKey-1]
	long.Key = bytes.Repeat([]byte{1}, MaxGrantKey+1)
	noTTL.TTLMs = 0
	longTTL.TTLMs = MaxGrantTTLMs + 1
	write.Write = true // with Uses 1
	noUses.Uses = 0
	manyUses.Uses = MaxGrantUses + 1
	bb := g(badBool)
	bb[8+3+2+len(testKey)] = 2
	pullShortKey := (&KVPull{KVRequest{Transfer: 1, Key: testKey[:3]}}).AppendBody(nil)
	for _, tc := range []struct {
		name string
		t    Type
		body []byte
		want error
		msg  string
	}{
		{"short key", TypeGrant, g(short), ErrMalformed, "Grant.Key: 15-byte key"},
		{"long key", TypeGrant, g(long), ErrTooLarge, "Grant.Key"},
		{"no ttl", TypeGrant, g(noTTL), ErrMalformed, "Grant.TTLMs: 0 ms"},
		{"ttl over cap", TypeGrant, g(longTTL), ErrMalformed, "Grant.TTLMs"},
		{"write with uses", TypeGrant, g(write), ErrMalformed, "Grant.Uses: 1 uses for a write"},
		{"read without uses", TypeGrant, g(noUses), ErrMalformed, "Grant.Uses: 0 uses for a read"},
		{"uses over cap", TypeGrant, g(manyUses), ErrMalformed, "Grant.Uses"},
		{"write byte", TypeGrant, bb, ErrMalformed, "Grant.Write: boolean byte is 2"},
		{"revoke short key", TypeRevokeGrant, (&RevokeGrant{Key: []byte("k")}).AppendBody(nil), ErrMalformed, "RevokeGrant.Key"},
		{"pull short key", TypeKVPull, pullShortKey, ErrMalformed, "KVPull.Key: 3-byte key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Decode(tc.t, tc.body)
			if m != nil || !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Decode: got %v, %v; want nil and %v naming %q", m, err, tc.want, tc.msg)
			}
		})
	}
}

// A keyless request is byte for byte what it was before keys: old peers
// read it, and a key adds its bytes at the end only.
func TestKVKeyTail(t *testing.T) {
	req := KVRequest{Transfer: 3, Name: "kv"}
	old := (&KVPull{req}).AppendBody(nil)
	req.Key = testKey
	keyed := (&KVPull{req}).AppendBody(nil)
	if !bytes.Equal(keyed[:len(old)], old) || !bytes.Equal(keyed[len(old):], append([]byte{16, 0}, testKey...)) {
		t.Fatalf("keyed pull:\n got %x\nwant %x then the key", keyed, old)
	}
}
