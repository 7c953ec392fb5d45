package main

import (
	"reflect"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/internal/knobs"
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
	if n := logs.FilterMessage("test fault switches set").Len(); n != 0 {
		t.Errorf("got %d test fault switch lines with none set, want 0", n)
	}
}

// The test fault switches set are logged at start, each with its value.
func TestLogStartConfigKnobs(t *testing.T) {
	cfg := config.Default()
	k, err := knobs.Parse([]string{knobs.FaultIPCImportEnv + "=1", knobs.HostmemFailAfterEnv + "=3"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.SetKnobs(k)
	core, logs := observer.New(zapcore.InfoLevel)
	logStartConfig(zap.New(core), cfg, nil)
	lines := logs.FilterMessage("test fault switches set").All()
	if len(lines) != 1 {
		t.Fatalf("got %d test fault switch lines, want 1", len(lines))
	}
	got := lines[0].ContextMap()["switches"]
	want := []any{"STAGE_TEST_FAULT_IPC_IMPORT=1", "STAGE_TEST_HOSTMEM_FAIL_AFTER=3"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("switches: got %#v, want %#v", got, want)
	}
}

// Settings that expose the sidecar are warned about at start (issue 35,
// item 5): no token, and a metrics page on every interface.
func TestLogStartConfigInsecure(t *testing.T) {
	cfg := config.Default()
	cfg.Security.AllowInsecure = true
	cfg.Metrics.Listen = ":7101"
	core, logs := observer.New(zapcore.InfoLevel)
	logStartConfig(zap.New(core), cfg, nil)
	var keys []string
	for _, e := range logs.FilterMessage("insecure setting").All() {
		if e.Level != zapcore.WarnLevel || e.ContextMap()["why"] == "" {
			t.Errorf("insecure setting logged as %v without a reason: %v", e.Level, e.ContextMap())
		}
		keys = append(keys, e.ContextMap()["key"].(string))
	}
	if want := []string{"security.allow_insecure", "metrics.listen"}; !reflect.DeepEqual(keys, want) {
		t.Errorf("warned about %v, want %v", keys, want)
	}
}
