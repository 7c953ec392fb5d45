//go:build race

package acl

// raceBuild: the sidecars under test are built with the race detector too.
const raceBuild = true
