package config

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"

	"github.com/stage-kv/stage/acl"
	"github.com/stage-kv/stage/cuda"
	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/device/hostmem"
	"github.com/stage-kv/stage/hip"
)

// DeviceCUDA configures the cuda backend (NVIDIA, libcuda loaded with
// dlopen).
type DeviceCUDA struct {
	Library   string `mapstructure:"library"`    // driver library: a path, or a name dlopen searches
	CopyMode  string `mapstructure:"copy_mode"`  // auto | kernel | batch | percopy
	EventWait string `mapstructure:"event_wait"` // auto | spin | block | hybrid
	PTX       string `mapstructure:"ptx"`        // PTX file replacing the embedded copy kernel; empty: embedded
}

// DeviceACL configures the acl backend (Ascend, libascendcl loaded with
// dlopen).
type DeviceACL struct {
	Library  string `mapstructure:"library"`   // runtime library: a path, or a name dlopen searches
	CopyMode string `mapstructure:"copy_mode"` // auto | batch | pack | percopy
}

// DeviceHIP configures the hip backend (AMD, libamdhip64 loaded with
// dlopen).
type DeviceHIP struct {
	Library string `mapstructure:"library"` // runtime library: a path, or a name dlopen searches
}

// Allowed values of the backend keys, for messages. The backends parse the
// same names (their tests check it). Treat as read-only.
var (
	CUDACopyModes  = []string{"auto", "kernel", "batch", "percopy"}
	CUDAEventWaits = []string{"auto", "spin", "block", "hybrid"}
	NodeWakeLinks  = []string{"auto", "on", "off"} // node.wake_link
	ACLCopyModes   = []string{"auto", "batch", "pack", "percopy"}
)

// Options is what device.Open hands the backend device.kind names: that
// backend's part of the device section, as the settings type its package
// owns (nil for a kind no backend has; device.Open refuses it).
func (d Device) Options() device.Options {
	var b any
	switch device.Kind(d.Kind) {
	case device.KindHostmem:
		b = hostmem.Config{BandwidthBytesPerSec: d.Hostmem.BandwidthGBps * 1e9, Latency: d.Hostmem.Latency,
			Fail: d.knobs.HostmemFail, FailAfter: d.knobs.HostmemFailAfter}
	case device.KindCUDA:
		b = cuda.Config{Library: d.CUDA.Library, CopyMode: cuda.CopyMode(d.CUDA.CopyMode),
			EventWait: cuda.EventWait(d.CUDA.EventWait), PTXFile: d.CUDA.PTX}
	case device.KindACL:
		b = acl.Config{Library: d.ACL.Library, CopyMode: acl.CopyMode(d.ACL.CopyMode)}
	case device.KindHIP:
		b = hip.Config{Library: d.HIP.Library}
	}
	return device.Options{Backend: b}
}

// device checks the device section.
func (v *validator) device(d Device) {
	v.oneOf("device.kind", d.Kind, DeviceKinds)
	if d.Ordinal < 0 {
		v.add("device.ordinal", fmt.Sprintf("must be >= 0 (got %d)", d.Ordinal))
	}
	v.hostmem(d.Hostmem)
	v.library("device.cuda.library", d.CUDA.Library)
	v.oneOf("device.cuda.copy_mode", d.CUDA.CopyMode, CUDACopyModes)
	v.oneOf("device.cuda.event_wait", d.CUDA.EventWait, CUDAEventWaits)
	if d.CUDA.PTX != "" {
		v.readable("device.cuda.ptx", d.CUDA.PTX, `use "" for the embedded kernel`)
	}
	v.library("device.acl.library", d.ACL.Library)
	v.oneOf("device.acl.copy_mode", d.ACL.CopyMode, ACLCopyModes)
	v.library("device.hip.library", d.HIP.Library)
}

func (v *validator) hostmem(h Hostmem) {
	if bw := h.BandwidthGBps; bw < 0 || math.IsNaN(bw) || math.IsInf(bw, 0) {
		v.add("device.hostmem.bandwidth_gbps", fmt.Sprintf("must be a finite number >= 0 (got %v); 0 means as fast as memmove", bw))
	}
	if h.Latency < 0 {
		v.add("device.hostmem.latency", fmt.Sprintf("must be >= 0 (got %s)", h.Latency))
	}
}

// library checks a vendor library key: a name (searched by dlopen) or a
// path. A path is not checked for existence here: it only matters to the
// backend device.kind names, which reports dlopen's own error.
func (v *validator) library(key, got string) {
	switch {
	case got == "":
		v.add(key, "empty; give the library's file name (searched like dlopen does) or its path")
	case strings.TrimSpace(got) != got:
		v.add(key, fmt.Sprintf("has leading or trailing white space (got %q); remove it", got))
	}
}

// readable checks that a file key names a regular file this process can read.
func (v *validator) readable(key, path, hint string) {
	f, err := os.Open(path)
	if err == nil {
		var fi os.FileInfo
		fi, err = f.Stat()
		f.Close()
		if err == nil && !fi.Mode().IsRegular() {
			err = errors.New("not a regular file")
		}
	}
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		v.add(key, fmt.Sprintf("cannot read it: %v (got %q); check the path and its permissions, or %s", err, path, hint))
	}
}
