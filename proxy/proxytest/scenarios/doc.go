// Package scenarios holds the end-to-end scenarios that need no process:
// transfers of every shape, KV conversions, bad input, peers and routes,
// TLS, metrics, a relay that cuts and damages streams. Each runs its
// sidecars inside the test process (proxytest), so `go test -race` sees
// both ends of every transfer. What needs a real staged process (a kill, a
// signal, a reload by SIGHUP, its stdout, its exit status, a per-process
// figure, a fault switch read from the environment, a GPU or a network
// namespace) stays in e2e.
//
// The package has tests only.
package scenarios
