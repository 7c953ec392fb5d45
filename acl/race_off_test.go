//go:build !race

package acl

const raceBuild = false
