// Package node is the sidecar's same-node room: the paths a transfer takes
// when both sidecars share a node. It serves this sidecar's node socket
// (handles of our regions for a peer to import, direct copies reported,
// chunks landed from a shared ring) and dials the peer's (handles taken
// and imported once per allocation, copies device to device, or chunks
// sent through a memfd ring both sides pinned), and decides per transfer
// whether a same-node path applies or the transfer falls back to TCP,
// counted by reason. It only decides: the sidecar asks Peer.Choose,
// starts the TCP path itself, and runs Peer.Push or Peer.Pull on a
// goroutine of its own, taking TCP when they return a Fallback error
// (NoteFallback counts it and says so).
//
// What a transfer is, and what landing or failing one means, is the
// sidecar's: it implements Host (sessions by id, copy streams, metrics),
// Session (one peer session) and Incoming (a peer's push landing here),
// and hands its own transfers over as Push and Pull. Nothing here imports
// package proxy.
package node
