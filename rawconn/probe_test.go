package rawconn

import (
	"testing"

	"go.uber.org/goleak"
)

func TestProbeSplice(t *testing.T) {
	defer goleak.VerifyNone(t)
	fds := openFDs(t)
	p, err := ProbeSplice(1<<20, 2)
	if err != nil {
		t.Fatal(err)
	}
	if p.Writev <= 0 || p.Splice <= 0 {
		t.Fatalf("probe measured %s: both must be positive", p)
	}
	if got := openFDs(t); got != fds {
		t.Fatalf("%d fds open after the probe, %d before", got, fds)
	}
	t.Log(p)
}

func TestProbeSpliceBadArgs(t *testing.T) {
	for _, tt := range []struct{ size, rounds int }{{0, 1}, {4096, 0}, {-1, 1}} {
		if _, err := ProbeSplice(tt.size, tt.rounds); err == nil {
			t.Errorf("ProbeSplice(%d, %d): no error", tt.size, tt.rounds)
		}
	}
}

func TestSpliceProbeFaster(t *testing.T) {
	for _, tt := range []struct {
		p    SpliceProbe
		want bool
	}{
		{SpliceProbe{Writev: 2e9, Splice: 3e9}, true},
		{SpliceProbe{Writev: 3e9, Splice: 2e9}, false},
		{SpliceProbe{Writev: 2e9, Splice: 2e9}, true},
	} {
		if got := tt.p.Faster(); got != tt.want {
			t.Errorf("%s: Faster() = %v, want %v", tt.p, got, tt.want)
		}
	}
}
