// Package staging moves bytes between devices and pinned host slots, and
// decides what moves when. It owns no sockets.
//
//   - Pool: a fixed set of pinned slots cut from one slab. Acquire blocks when
//     the pool is empty: that is the backpressure; nothing queues without bound.
//   - Plan: cuts a transfer's ops into slot-sized chunks, coalescing adjacent
//     small blocks and splitting large ranges.
//   - Copier: runs gathers (device -> slot) and scatters (slot -> device) on a
//     device stream and calls back, in order, when each has completed.
//   - Sender: the pure scheduling core for outgoing chunks. It does no I/O and
//     reads no clock: the proxy feeds it events (submit, copy done, written,
//     ack, credit, stream lost, tick) and performs the commands it returns
//     (copy this chunk into that slot, send that slot on this stream,
//     transfer T is complete). Its tests need no device and no socket.
//   - Receiver: the pure core for incoming chunks, one per peer session:
//     the credit, duplicate and tombstone rules (PROTOCOL 8.7). The proxy
//     feeds it events (transfer admitted, chunk header read, chunk landed
//     or damaged, stream lost under a chunk, tick, session closed) and
//     performs what it returns (Ack, Credit, Resend, Nack, completions,
//     regions to let go of); its traces are in testdata/receiver.
//
// Ownership: a slot belongs to the Sender from the moment it hands it out in
// a Copy command until the matching Written event comes back.
package staging
