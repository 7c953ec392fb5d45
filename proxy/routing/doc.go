// Package routing holds the sidecar's routes: which peers each route has
// (static from the config, found in DNS, or dialed on demand within an
// allow list), one session kept to each of them, redialed with backoff,
// peers drained when they leave, and which session a submit gets (Pick),
// refusing at once a peer that is down.
//
// It never opens a socket or speaks the protocol: sessions are the
// sidecar's, dialed through its Host and seen only through the small
// Session interface, so every decision here (which peer, which is down,
// when to dial again) is tested with fakes. Each Route holds its own lock;
// the Table its own, never held while a route's is taken. The Host's Room
// is called with a route's lock held, so it must not call back into the
// route.
//
// Goroutines (a dial loop per peer, a drain waiter per draining peer, a
// janitor and a DNS watcher per route) are counted in the WaitGroup the
// sidecar passes to New and end when the context given to Start ends or
// their route is removed.
package routing
