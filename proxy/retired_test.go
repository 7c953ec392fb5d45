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
	ss.s = &Server{xfers: newXferTable()}
	for i := uint64(0); i < maxRetired+10; i++ {
		id := 2 * (i + 1)
		ss.out.serve(id, staging.Key(1000+i))
		ss.out.retire(id, staging.Key(1000+i))
		ss.out.retire(id, staging.Key(1000+i)) // a second retire changes nothing
	}
	for _, tc := range []struct {
		id   uint64
		want answerer
	}{
		{2, unknown{}},         // the oldest were forgotten
		{20, unknown{}},        // the 10th: forgotten too
		{22, coreServed(1010)}, // the 11th: kept
		{2 * (maxRetired + 10), coreServed(1000 + maxRetired + 9)}, // the last
		{2 * (maxRetired + 11), unknown{}},                         // never served
		{3, corePush(1)},                                           // odd: our own push, always ours (id >> 1)
	} {
		if got := answererOf(ss, tc.id); got != tc.want {
			t.Errorf("answererOf(%d) = %#v; want %#v", tc.id, got, tc.want)
		}
	}
	if len(ss.out.retired) != maxRetired || len(ss.out.retRing) != maxRetired {
		t.Fatalf("kept %d ids (ring %d), want %d", len(ss.out.retired), len(ss.out.retRing), maxRetired)
	}
}
