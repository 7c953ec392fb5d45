// Package e2etest is the harness of the tests that run sidecars, beside
// them: the e2e tests, acl's e2e tests, and the in-process scenarios
// (proxy/proxytest/scenarios) for the metrics page.
//
// Binary and Build build staged for tests (race-enabled when the tests
// are), or take a prebuilt one from $STAGED_BIN on machines without Go.
// Settle and CheckIdle take a sidecar's figures through its control socket
// once its sessions are up and hold it to them after a test: no slot,
// transfer or peer mapping left, no more regions, goroutines or fds.
// Scrape and MetricValue read its metrics page.
//
// Starting and stopping the processes is internal/sidecars', which
// stagectl shares; this package is for tests only.
package e2etest
