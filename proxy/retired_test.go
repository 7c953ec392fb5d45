package proxy

import (
	"testing"

	"github.com/stage-kv/stage/staging"
)

// A pull we served keeps its wire id's core key after it retired, so a
// late Ack still reaches the core (which returns the credits it owes, and
// only those); the last maxRetired are kept, and unknown ids map to
// nothing.
func TestServedPullKeyOutlivesRetire(t *testing.T) {
	ss := testSession(true) // we dialed: the pulls we serve have even ids
	ss.served, ss.retired = map[uint64]staging.Key{}, map[uint64]staging.Key{}
	for i := uint64(0); i < maxRetired+10; i++ {
		id := 2 * (i + 1)
		ss.served[id] = staging.Key(1000 + i)
		ss.mu.Lock()
		delete(ss.served, id)
		ss.keepRetiredLocked(id, staging.Key(1000+i))
		ss.keepRetiredLocked(id, staging.Key(1000+i)) // a second retire changes nothing
		ss.mu.Unlock()
	}
	for _, tc := range []struct {
		id   uint64
		key  staging.Key
		want bool
	}{
		{2, 0, false},    // the oldest were forgotten
		{20, 0, false},   // the 10th: forgotten too
		{22, 1010, true}, // the 11th: kept
		{2 * (maxRetired + 10), 1000 + maxRetired + 9, true}, // the last
		{2 * (maxRetired + 11), 0, false},                    // never served
		{3, 1, true},                                         // odd: our own push, always ours (id >> 1)
	} {
		key, ok := ss.coreKey(tc.id)
		if ok != tc.want || (ok && key != tc.key) {
			t.Errorf("coreKey(%d) = %d, %v; want %d, %v", tc.id, key, ok, tc.key, tc.want)
		}
	}
	if len(ss.retired) != maxRetired || len(ss.retRing) != maxRetired {
		t.Fatalf("kept %d ids (ring %d), want %d", len(ss.retired), len(ss.retRing), maxRetired)
	}
}
