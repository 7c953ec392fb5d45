// Package proxy is the sidecar: it listens for peers, dials the peers of its
// routes, authenticates sessions, moves chunks over data streams, keeps the
// transfer tables, and answers the engines' requests. Its rooms: the
// control socket (package engine, whose Backend engines.go implements),
// the same-node paths (node, whose Host, Session and Incoming nodes.go
// implements), the region table (region), the coded error (status), the
// Unix-socket frames and fds (unixsock).
//
// Threads of control:
//   - one goroutine runs the staging.Sender core (loop.go) and performs the
//     commands it returns; everything that affects outgoing chunks reaches it
//     as an event through a mailbox;
//   - gnet event loops run the peer control sessions (control.go); their
//     handlers never block;
//   - each data stream has a reader and a writer goroutine (data.go): the
//     writer writev's a chunk header and the pinned slot, the reader reads
//     payloads straight into pinned slots of the receive pool;
//   - each control-socket client has a reader and a writer goroutine
//     (package engine).
//
// Bulk bytes only ever live in pinned slots; control messages are encoded
// into bytebufferpool buffers.
package proxy
