// Package fanout runs one loop over many items in parallel slices, where
// the machine has processors to spare and the items are many enough to pay
// for the goroutines. The decode and the check of a large Submit (a push
// of 65,536 blocks is 2 MiB of ops) use it: both sit on the path from the
// engine's call to the transfer's first chunk.
package fanout

import (
	"runtime"
	"sync"
)

// MaxSlices bounds the slices of one loop.
const MaxSlices = 8

// Slices is how many slices to cut n items into on procs processors: at
// most MaxSlices and half the processors, none under minSlice items, and 1
// (run serially) on fewer than 4 processors.
func Slices(n, minSlice, procs int) int {
	if procs < 4 || minSlice < 1 {
		return 1
	}
	return max(1, min(MaxSlices, procs/2, n/minSlice))
}

// Auto is Slices on this process's GOMAXPROCS.
func Auto(n, minSlice int) int { return Slices(n, minSlice, runtime.GOMAXPROCS(0)) }

// Run calls f(j, lo, hi) for slice j of k over items [0, n), each in its
// own goroutine (the last on the caller's), and returns when all have.
// Slices are contiguous and in order: [lo, hi) of slice j ends where slice
// j+1 starts.
func Run(n, k int, f func(j, lo, hi int)) {
	k = max(1, min(k, n))
	per := (n + k - 1) / k
	var wg sync.WaitGroup
	for j := 0; j < k; j++ {
		lo, hi := j*per, min((j+1)*per, n)
		if j == k-1 {
			f(j, lo, hi)
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(j, lo, hi)
		}()
	}
	wg.Wait()
}
