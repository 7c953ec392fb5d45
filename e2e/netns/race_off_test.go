//go:build !race

package netns

const raceBuild = false
