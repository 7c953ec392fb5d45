// Package sidecars starts staged processes and waits until they are ready:
// the one process-launching code, behind `stagectl demo` and `stagectl
// bench --spawn`, the e2e tests and acl's.
//
// A process is started with a config file written beside its log, reports
// where it listens on its "staged ready" line (the only line staged writes
// to stdout), and is stopped with a signal and a deadline. Config builds
// the YAML such a local sidecar runs with. Errors carry the tail of the
// process's log, which is where a sidecar says why it failed.
//
// It imports nothing of stage: what a test asks a started sidecar (its
// figures, its metrics page) and building staged for tests are
// e2e/e2etest's.
package sidecars
