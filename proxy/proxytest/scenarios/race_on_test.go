//go:build race

package scenarios_test

// raceBuild: the race detector slows every byte the test itself touches
// (filling and verifying caches) several times over.
const raceBuild = true
