//go:build !race

package scenarios_test

const raceBuild = false
