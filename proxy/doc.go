// Package proxy is the sidecar: it listens for peers, dials the peers of its
// routes, authenticates sessions, moves chunks over data streams, keeps the
// transfer tables, and answers the engines' requests. Its rooms: the
// control socket (package engine, whose Backend engines.go implements),
// the routes and their peers (routing, whose Host and Session routes.go
// implements), the same-node paths (node, whose Host, Session and Incoming
// nodes.go implements), the region table (region), the pure core of KV
// grants (grant), the coded error (status), the Unix-socket frames and
// fds (unixsock).
//
// A peer session (session.go) is its link (control connection, lifecycle,
// send) and data streams (streams.go), with two halves that each keep a
// lock of their own: what lands here (inbound, recv_inbound.go) and the
// answer table of what we send (answerTable, send_answertable.go). No
// lock of a session is held while another is taken.
//
// A chunk's walk reads from the file names: send_*.go on the side its
// bytes leave (submit, start, loop, gather, stream), recv_*.go on the side
// they land (stream, admit, dest, xfer, inline); docs/ARCHITECTURE.md
// follows one chunk file by file.
//
// Threads of control:
//   - one goroutine runs the staging.Sender core (send_loop.go) and performs
//     the commands it returns; everything that affects outgoing chunks
//     reaches it as an event through a mailbox;
//   - gnet event loops run the peer control sessions (control.go); their
//     handlers never block;
//   - each data stream (data.go) has a reader (recv_stream.go) and a writer
//     goroutine (send_stream.go): by default the writer sends a chunk
//     header and then hands the pinned slot's pages to the socket by
//     vmsplice and splice (staging.splice_send, on unless turned off;
//     send_splice.go says where it applies: plaintext streams, a device
//     that renews slots, and with staging.splice_probe a probe that found
//     it no slower), else header and slot in one writev; the reader reads
//     payloads straight into pinned slots of the receive pool;
//   - each control-socket client has a reader and a writer goroutine
//     (package engine).
//
// Bulk bytes only ever live in pinned slots; control messages are encoded
// into bytebufferpool buffers.
package proxy
