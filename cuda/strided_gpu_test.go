//go:build gpu

package cuda

import (
	"math/rand/v2"
	"testing"

	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/devicetest"
)

// TestGPUStrided: every list of stridedCases gathers and scatters
// byte-exact on the real driver (checkGatherScatter compares with the
// host's copy of the pool and checks that nothing else changed), and the
// lists that compress do take the strided kernel; so do run lists moved
// with GatherRuns and ScatterRuns.
func TestGPUStrided(t *testing.T) {
	d := openGPU(t, CopyKernel)
	if d.fnStrided == nil {
		t.Fatalf("the module has no strided kernel: %v", d.stridedErr)
	}
	const poolSize = 64 << 20
	pool, data := devicetest.Pool(t, d, poolSize, 41)
	p, err := d.AllocPinned(16 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer d.FreePinned(p)
	s, err := d.NewCUDAStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i, tc := range stridedCases(rand.New(rand.NewPCG(42, 43)), pool, poolSize) {
		t.Run(tc.name, func(t *testing.T) {
			devicetest.CheckGatherScatter(t, d, d, pool, data, tc.segs, uint64(50+i))
			before := s.stridedLaunches
			if err := s.Gather(p.Slice(0, int(device.SegsLen(tc.segs))), tc.segs); err != nil {
				t.Fatal(err)
			}
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if got := s.stridedLaunches > before; got != tc.strided {
				t.Errorf("strided kernel launched: %v, want %v", got, tc.strided)
			}
		})
	} // Run lists through GatherRuns and ScatterRuns, written straight as
	// strided descriptors.
	for i, tc := range runCases(rand.New(rand.NewPCG(92, 93)), pool, poolSize) {
		t.Run("runs/"+tc.name, func(t *testing.T) {
			devicetest.CheckRuns(t, d, d, pool, data, tc.runs, uint64(100+i))
			var total uint64
			for _, r := range tc.runs {
				total += r.Bytes()
			}
			before := s.stridedLaunches
			if err := s.GatherRuns(p.Slice(0, int(total)), tc.runs); err != nil {
				t.Fatal(err)
			}
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if got := s.stridedLaunches > before; got != tc.strided {
				t.Errorf("strided kernel launched: %v, want %v", got, tc.strided)
			}
		})
	}
}
