// Package proxy is the sidecar: it listens for peers, dials the peers of its
// routes, authenticates sessions, moves chunks over data streams, keeps the
// transfer tables, and answers the engines' requests. Its rooms: the
// control socket (package engine, whose Backend engines.go implements),
// the same-node paths (node, whose Host, Session and Incoming nodes.go
// implements), the region table (region), the coded error (status), the
// Unix-socket frames and fds (unixsock).
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
//     goroutine (send_stream.go): the writer writev's a chunk header and the
//     pinned slot, the reader reads payloads straight into pinned slots of
//     the receive pool;
//   - each control-socket client has a reader and a writer goroutine
//     (package engine).
//
// Bulk bytes only ever live in pinned slots; control messages are encoded
// into bytebufferpool buffers.
package proxy
