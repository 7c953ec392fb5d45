// Package e2e holds multi-process tests: real staged processes on loopback,
// driven through the Go client, with engine memory from kvsim. The binaries
// are built once per test run (TestMain). After every test the sidecars must
// be back to their idle figures: no pinned slot in use, no transfer active,
// goroutines and fds back to where they were.
//
// Only what needs a real process is here: a kill, a signal, a reload by
// SIGHUP, stdout, an exit status, a per-process figure (fds, RSS), a GPU.
// Scenarios that need none run in-process in proxy/proxytest/scenarios,
// where the race detector sees both sidecars; the test fault switches reach
// them as config (Config.SetKnobs), as staged reads them from STAGE_TEST_*.
package e2e
