// Package e2e holds multi-process tests: real staged processes on loopback,
// driven through the Go client, with engine memory from kvsim. The binaries
// are built once per test run (TestMain). After every test the sidecars must
// be back to their idle figures: no pinned slot in use, no transfer active,
// goroutines and fds back to where they were.
package e2e
