//go:build race

package e2e

// raceBuild: the sidecars under test are built with the race detector too.
const raceBuild = true
