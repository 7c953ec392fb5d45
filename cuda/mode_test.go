package cuda

import (
	"errors"
	"strings"
	"testing"

	"github.com/stage-kv/stage/device"
)

func TestChooseCopyMode(t *testing.T) {
	noKernel := errors.New("no PTX")
	noBatch := errors.New("no batch")
	tests := []struct {
		want                CopyMode
		kernelErr, batchErr error
		got                 CopyMode
		whyHas              string
		fails               bool
	}{
		{CopyAuto, nil, nil, CopyKernel, "auto", false},
		{CopyAuto, noKernel, nil, CopyBatch, "no PTX", false},
		{CopyAuto, nil, noBatch, CopyKernel, "auto", false},
		{CopyAuto, noKernel, noBatch, CopyPerCopy, "no batch", false},
		{CopyKernel, nil, noBatch, CopyKernel, "requested", false},
		{CopyKernel, noKernel, nil, "", "", true},
		{CopyBatch, noKernel, nil, CopyBatch, "requested", false},
		{CopyBatch, nil, noBatch, "", "", true},
		{CopyPerCopy, noKernel, noBatch, CopyPerCopy, "requested", false},
		{"bogus", nil, nil, "", "", true},
	}
	for _, tc := range tests {
		got, why, err := chooseCopyMode(tc.want, tc.kernelErr, tc.batchErr)
		if tc.fails {
			if err == nil {
				t.Errorf("want %q (kernel %v, batch %v): got %q, want an error", tc.want, tc.kernelErr, tc.batchErr, got)
			} else if tc.want != "bogus" && !errors.Is(err, device.ErrNotSupported) {
				t.Errorf("want %q: error %v does not wrap ErrNotSupported", tc.want, err)
			}
			continue
		}
		if err != nil || got != tc.got || !strings.Contains(why, tc.whyHas) {
			t.Errorf("want %q (kernel %v, batch %v): got (%q, %q, %v), want (%q, ...%s..., nil)", tc.want, tc.kernelErr, tc.batchErr, got, why, err, tc.got, tc.whyHas)
		}
	}
	if fallbackMode(nil) != CopyBatch || fallbackMode(noBatch) != CopyPerCopy {
		t.Error("fallbackMode")
	}
}

func TestParseCopyMode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want CopyMode
		bad  bool
	}{
		{"", CopyAuto, false},
		{"auto", CopyAuto, false},
		{"batch", CopyBatch, false},
		{"kernel", CopyKernel, false},
		{"percopy", CopyPerCopy, false},
		{"fast", "", true},
	} {
		got, err := ParseCopyMode(tc.in)
		if tc.bad {
			if err == nil || !strings.Contains(err.Error(), `copy mode "fast"`) {
				t.Errorf("%q: got (%q, %v), want an error naming it", tc.in, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: got (%q, %v), want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestParseEventWait(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want EventWait
		spin int64
		bad  bool
	}{
		{"", WaitHybrid, hybridSpin, false},
		{"auto", WaitHybrid, hybridSpin, false},
		{"spin", WaitSpin, 0, false},
		{"block", WaitBlock, 0, false},
		{"busy", "", 0, true},
	} {
		got, err := ParseEventWait(tc.in)
		if tc.bad {
			if err == nil || !strings.Contains(err.Error(), `event wait "busy"`) {
				t.Errorf("%q: got (%q, %v), want an error naming it", tc.in, got, err)
			}
			continue
		}
		if err != nil || got != tc.want || got.spin() != tc.spin {
			t.Errorf("%q: got (%q, spin %d, %v), want %q, spin %d", tc.in, got, got.spin(), err, tc.want, tc.spin)
		}
	}
}
