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

func TestCopyModeEnv(t *testing.T) {
	for _, tc := range []struct {
		env  string
		cfg  CopyMode
		want CopyMode
		bad  bool
	}{
		{"", CopyAuto, CopyAuto, false},
		{"auto", CopyAuto, CopyAuto, false},
		{"batch", CopyAuto, CopyBatch, false},
		{"percopy", CopyKernel, CopyKernel, false}, // explicit config wins
		{"kernel", CopyAuto, CopyKernel, false},
		{"fast", CopyAuto, "", true},
	} {
		t.Setenv("STAGE_CUDA_COPY", tc.env)
		got, err := copyModeFromEnv(tc.cfg)
		if tc.bad {
			if err == nil || !strings.Contains(err.Error(), "STAGE_CUDA_COPY") {
				t.Errorf("env %q: got (%q, %v), want an error naming STAGE_CUDA_COPY", tc.env, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("env %q cfg %q: got (%q, %v), want %q", tc.env, tc.cfg, got, err, tc.want)
		}
	}
}

func TestEventWaitEnv(t *testing.T) {
	for _, tc := range []struct {
		env  string
		cfg  EventWait
		want EventWait
		spin int64
		bad  bool
	}{
		{"", WaitAuto, WaitHybrid, hybridSpin, false},
		{"auto", WaitAuto, WaitHybrid, hybridSpin, false},
		{"spin", WaitAuto, WaitSpin, 0, false},
		{"block", WaitAuto, WaitBlock, 0, false},
		{"block", WaitSpin, WaitSpin, 0, false}, // explicit config wins
		{"busy", WaitAuto, "", 0, true},
	} {
		t.Setenv("STAGE_CUDA_EVENT_WAIT", tc.env)
		got, err := eventWaitFromEnv(tc.cfg)
		if tc.bad {
			if err == nil || !strings.Contains(err.Error(), "STAGE_CUDA_EVENT_WAIT") {
				t.Errorf("env %q: got (%q, %v), want an error naming STAGE_CUDA_EVENT_WAIT", tc.env, got, err)
			}
			continue
		}
		if err != nil || got != tc.want || got.spin() != tc.spin {
			t.Errorf("env %q cfg %q: got (%q, spin %d, %v), want %q, spin %d", tc.env, tc.cfg, got, got.spin(), err, tc.want, tc.spin)
		}
	}
}
