package staging

import "time"

// Shape is when a push's chunks moved, for telling where one transfer's
// time goes (docs/BENCHMARKS.md: the ramp, the tail, the drain). The core
// fills it from the events' times; it reads no clock of its own.
type Shape struct {
	Submitted     time.Time // EvSubmit
	FirstGathered time.Time // the first chunk gathered into its slot
	FirstWritten  time.Time // the first chunk in a socket
	// FirstStreamDone is when the first of the streams that carried
	// chunks wrote its last one: from here on fewer streams are writing.
	FirstStreamDone time.Time
	LastWritten     time.Time // the last chunk in a socket
	Done            time.Time // the completion (the last ack, or the failure)
	Streams         int       // streams that carried chunks
}

// Gather is from the submit to the first chunk gathered.
func (h Shape) Gather() time.Duration { return span(h.Submitted, h.FirstGathered) }

// Ramp is from the submit to the first chunk in a socket.
func (h Shape) Ramp() time.Duration { return span(h.Submitted, h.FirstWritten) }

// Tail is from the first stream's last write to the last write: the time
// some streams sat idle while others still wrote this transfer.
func (h Shape) Tail() time.Duration { return span(h.FirstStreamDone, h.LastWritten) }

// Drain is from the last write to the completion: the sockets emptying,
// the receiver's last copies and its acks.
func (h Shape) Drain() time.Duration { return span(h.LastWritten, h.Done) }

// Total is from the submit to the completion.
func (h Shape) Total() time.Duration { return span(h.Submitted, h.Done) }

// span is b-a, or 0 where either time is missing.
func span(a, b time.Time) time.Duration {
	if a.IsZero() || b.IsZero() || b.Before(a) {
		return 0
	}
	return b.Sub(a)
}

// shapeClock keeps a transfer's Shape as its events come.
type shapeClock struct {
	Shape
	lastOn []time.Time // lastOn[stream]: its last write of this transfer
}

func (k *shapeClock) gathered(now time.Time) {
	if k.FirstGathered.IsZero() {
		k.FirstGathered = now
	}
}

func (k *shapeClock) written(stream int, now time.Time) {
	if k.FirstWritten.IsZero() {
		k.FirstWritten = now
	}
	k.LastWritten = now
	if stream < 0 || stream > 1<<16 {
		return
	}
	for len(k.lastOn) <= stream {
		k.lastOn = append(k.lastOn, time.Time{})
	}
	k.lastOn[stream] = now
}

// done ends the shape at now.
func (k *shapeClock) done(now time.Time) Shape {
	k.Done = now
	k.Streams = 0
	k.FirstStreamDone = time.Time{}
	for _, t := range k.lastOn {
		if t.IsZero() {
			continue
		}
		k.Streams++
		if k.FirstStreamDone.IsZero() || t.Before(k.FirstStreamDone) {
			k.FirstStreamDone = t
		}
	}
	return k.Shape
}
