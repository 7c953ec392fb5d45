package routing

import "time"

// Backoff is a doubling wait between attempts: First, then twice the wait
// before, never more than Max. The zero value of its state starts over.
type Backoff struct {
	First, Max time.Duration
	next       time.Duration
}

// Next is the wait before the next attempt.
func (b *Backoff) Next() time.Duration {
	if b.next == 0 {
		b.next = b.First
	}
	d := b.next
	b.next = min(2*d, b.Max)
	return d
}

// Reset starts over at First (an attempt succeeded).
func (b *Backoff) Reset() { b.next = 0 }
