// Package client is the Go client of a sidecar's local control socket: an
// engine (or stagectl, or a test) registers its device memory, submits
// push and pull transfers of byte ranges on named routes, waits for them,
// subscribes to transfers that land here, and reads stats.
//
// A Client is safe for concurrent use: requests carry ids, one reader
// goroutine matches answers to requests. It never touches device memory.
package client
