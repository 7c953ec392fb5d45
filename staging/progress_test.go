package staging

import "testing"

// Each Ack that counts reports the transfer's acked bytes in
// Ready.Progress; a forged or repeated one reports nothing, and the last
// one leaves the count to the completion.
func TestSenderReportsProgress(t *testing.T) {
	h := newHarness(t, 4)
	var got []Progress
	h.onReady = func(r *Ready) { got = append(got, r.Progress...) }
	h.step(Event{Kind: EvSessionUp, Session: 1, N: 1, Credits: 4})
	h.step(Event{Kind: EvSubmit, Session: 1, Transfer: 1, Plan: plan(t, 3)})
	h.finishCopies(nil)
	h.finishSends(nil)
	for _, tc := range []struct {
		chunks []uint32
		want   []Progress
	}{
		{[]uint32{1}, []Progress{{1, 8}}},
		{[]uint32{1}, nil}, // answered already
		{[]uint32{7}, nil}, // no such chunk
		{[]uint32{0}, []Progress{{1, 16}}},
		{[]uint32{2}, nil}, // the last: the completion carries the bytes
	} {
		got = nil
		h.step(Event{Kind: EvAck, Session: 1, Transfer: 1, Chunks: tc.chunks})
		if len(got) != len(tc.want) || (len(got) > 0 && got[0] != tc.want[0]) {
			t.Fatalf("ack %v: progress %+v, want %+v", tc.chunks, got, tc.want)
		}
	}
	if err, ok := h.done[1]; !ok || err != nil {
		t.Fatalf("done %v err %v, want success", ok, err)
	}
}
