package grant

import (
	"errors"
	"testing"
	"time"
)

// A scripted sequence per case: grants added, revoked, time moved, and
// each peer request with the answer it must get.
func TestSet(t *testing.T) {
	t0 := time.Unix(1000, 0)
	k, other := []byte("0123456789abcdef"), []byte("fedcba9876543210")
	read := func(uses int, ttl time.Duration, b ...uint32) Grant {
		return Grant{Blocks: b, Expires: t0.Add(ttl), Uses: uses}
	}
	type step struct {
		add    *Grant
		revoke bool
		at     time.Duration
		key    []byte
		write  bool
		blocks []uint32
		want   error
	}
	g1 := read(1, time.Minute, 4, 2, 9)
	g2 := read(2, time.Minute, 4, 2, 9)
	w := Grant{Write: true, Blocks: []uint32{1, 2}, Expires: t0.Add(time.Minute)}
	guard := Grant{Expires: t0.Add(time.Minute)}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"unguarded, keyless", []step{{key: nil, blocks: []uint32{1}, want: nil}}},
		{"unguarded, unknown key", []step{{key: k, blocks: []uint32{1}, want: ErrNoGrant}}},
		{"guard only", []step{{add: &guard}, {key: nil, blocks: []uint32{1}, want: ErrNoGrant}, {key: k, blocks: nil, want: ErrNoGrant}}},
		{"once", []step{{add: &g1}, {key: k, blocks: []uint32{4, 2, 9}}, {key: k, blocks: []uint32{4, 2, 9}, want: ErrNoGrant}}},
		{"two uses", []step{{add: &g2}, {key: k, blocks: []uint32{4, 2, 9}}, {key: k, blocks: []uint32{4, 2, 9}}, {key: k, blocks: []uint32{4, 2, 9}, want: ErrNoGrant}}},
		{"keyless when guarded", []step{{add: &g1}, {key: nil, blocks: []uint32{4, 2, 9}, want: ErrNoGrant}}},
		{"other key", []step{{add: &g1}, {key: other, blocks: []uint32{4, 2, 9}, want: ErrNoGrant}}},
		{"fewer blocks", []step{{add: &g1}, {key: k, blocks: []uint32{4, 2}, want: ErrBlocks}, {key: k, blocks: []uint32{4, 2, 9}}}},
		{"other order", []step{{add: &g1}, {key: k, blocks: []uint32{2, 4, 9}, want: ErrBlocks}}},
		{"other block", []step{{add: &g1}, {key: k, blocks: []uint32{4, 2, 1<<17 | 9}, want: ErrBlocks}}},
		{"expired", []step{{add: &g1}, {at: time.Minute, key: k, blocks: []uint32{4, 2, 9}, want: ErrNoGrant}}},
		{"just before expiry", []step{{add: &g1}, {at: time.Minute - 1, key: k, blocks: []uint32{4, 2, 9}}}},
		{"revoked", []step{{add: &g1}, {revoke: true}, {key: k, blocks: []uint32{4, 2, 9}, want: ErrNoGrant}}},
		{"read grant, write request", []step{{add: &g1}, {key: k, write: true, blocks: []uint32{4, 2, 9}, want: ErrAccess}}},
		{"write grant, many writes", []step{{add: &w}, {key: k, write: true, blocks: []uint32{1, 2}}, {key: k, write: true, blocks: []uint32{1, 2}}, {key: k, blocks: []uint32{1, 2}, want: ErrAccess}}},
		{"write grant revoked", []step{{add: &w}, {revoke: true}, {key: k, write: true, blocks: []uint32{1, 2}, want: ErrNoGrant}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewSet(4)
			for i, st := range tc.steps {
				now := t0.Add(st.at)
				switch {
				case st.add != nil:
					if err := s.Add(k, *st.add, now); err != nil {
						t.Fatalf("step %d: Add: %v", i, err)
					}
				case st.revoke:
					if !s.Revoke(k) {
						t.Fatalf("step %d: Revoke found nothing", i)
					}
				default:
					if err := s.Use(st.key, st.write, st.blocks, now); !errors.Is(err, st.want) || (err == nil) != (st.want == nil) {
						t.Fatalf("step %d: Use: got %v, want %v", i, err, st.want)
					}
				}
			}
		})
	}
}

// The set is bounded: a full set refuses until grants expire or go.
func TestSetCap(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := NewSet(2)
	key := func(i byte) []byte { return []byte{i, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15} }
	for i := byte(0); i < 2; i++ {
		if err := s.Add(key(i), Grant{Blocks: []uint32{1}, Expires: t0.Add(time.Duration(i+1) * time.Second), Uses: 1}, t0); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Add(key(2), Grant{Blocks: []uint32{1}, Expires: t0.Add(time.Minute), Uses: 1}, t0); !errors.Is(err, ErrFull) {
		t.Fatalf("third grant: got %v, want ErrFull", err)
	}
	if err := s.Add(key(1), Grant{Blocks: []uint32{2}, Expires: t0.Add(time.Minute), Uses: 1}, t0); err != nil {
		t.Fatalf("replacing a grant of a full set: %v", err)
	}
	if err := s.Add(key(2), Grant{Blocks: []uint32{1}, Expires: t0.Add(time.Minute), Uses: 1}, t0.Add(time.Second)); err != nil {
		t.Fatalf("after the first expired: %v", err)
	}
	if s.Len() != 2 {
		t.Fatalf("Len %d, want 2", s.Len())
	}
	// The set keeps its own copy of the blocks.
	b := []uint32{7}
	_ = s.Add(key(3), Grant{Blocks: b, Expires: t0.Add(time.Hour), Uses: 1}, t0.Add(time.Hour))
	b[0] = 8
	if err := s.Use(key(3), false, []uint32{7}, t0.Add(time.Hour-1)); err != nil {
		t.Fatalf("the caller's slice changed the grant: %v", err)
	}
}
