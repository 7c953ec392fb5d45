// Package sidecars starts staged processes and waits until they are ready:
// the one process-launching harness behind the e2e tests, acl's e2e tests
// and `stagectl demo` / `stagectl bench --spawn`.
//
// A process is started with a config file written beside its log, reports
// where it listens on its "staged ready" line (the only line staged writes
// to stdout), and is stopped with a signal and a deadline. Config builds
// the YAML such a local sidecar runs with. Errors carry the tail of the
// process's log, which is where a sidecar says why it failed.
package sidecars
