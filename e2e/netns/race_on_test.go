//go:build race

package netns

// raceBuild: the sidecars under test are built with the race detector too.
const raceBuild = true
