package main

import (
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/stage-kv/stage/config"
)

func TestLogStartConfig(t *testing.T) {
	cfg := config.Default()
	cfg.Device.Kind = "cuda"
	cfg.Device.CUDA.CopyMode = "batch"
	core, logs := observer.New(zapcore.InfoLevel)
	logStartConfig(zap.New(core), cfg, []string{"STAGE_CUDA_COPY=kernel", "STAGE_STAGING_SLOTS=8", "STAGE_TEST_X=1", "STAGE_STAGIN_SLOTS=2", "HOME=/"})

	dev := logs.FilterMessage("device config").All()
	if len(dev) != 1 {
		t.Fatalf("got %d device config lines, want 1", len(dev))
	}
	if m := dev[0].ContextMap(); m["kind"] != "cuda" || m["copy_mode"] != "batch" || m["library"] != "libcuda.so.1" || m["event_wait"] != "auto" {
		t.Errorf("device config fields: %v", m)
	}
	var warned []string
	for _, e := range logs.FilterLevelExact(zapcore.WarnLevel).All() {
		warned = append(warned, e.ContextMap()["variable"].(string))
		if e.ContextMap()["variable"] == "STAGE_CUDA_COPY" && e.ContextMap()["renamed_to"] != "STAGE_DEVICE_CUDA_COPY_MODE (device.cuda.copy_mode)" {
			t.Errorf("STAGE_CUDA_COPY warning without its new name: %v", e.ContextMap())
		}
	}
	if len(warned) != 2 || warned[0] != "STAGE_CUDA_COPY" || warned[1] != "STAGE_STAGIN_SLOTS" {
		t.Errorf("warned about %v, want [STAGE_CUDA_COPY STAGE_STAGIN_SLOTS]", warned)
	}
}
