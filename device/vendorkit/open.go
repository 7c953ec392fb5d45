package vendorkit

import (
	"fmt"
	"slices"
	"strings"
)

// OpenShared opens device ordinal with cfg on the process-wide library
// named lib (the config's library key; "" the backend's default): shared
// is the backend's SharedLibrary, open its Library's OpenDevice.
func OpenShared[L, C, D any](ordinal int, cfg C, lib string, shared func(string) (L, error), open func(L, int, C) (D, error)) (D, error) {
	l, err := shared(lib)
	if err != nil {
		var zero D
		return zero, err
	}
	return open(l, ordinal, cfg)
}

// ParseMode reads a copy mode as vendor's config key (device.VENDOR.copy_mode)
// spells it: "" and "auto" are the zero mode, names the others.
func ParseMode[M ~string](vendor, s string, names ...string) (M, error) {
	switch {
	case s == "" || s == "auto":
		return "", nil
	case slices.Contains(names, s):
		return M(s), nil
	}
	return "", fmt.Errorf("%s: copy mode %q: want %s or auto", vendor, s, strings.Join(names, ", "))
}

// Codes maps a runtime's error codes onto device's sentinels
// (device.ErrOutOfMemory, device.ErrNotSupported, device.ErrNotReady...).
type Codes []Sentinel

// Sentinel is one of device's errors and the codes that are it.
type Sentinel struct {
	Err   error
	Codes []int
}

// Is reports whether code is target, for a backend's Error.Is.
func (cs Codes) Is(code int, target error) bool {
	for _, s := range cs {
		if s.Err == target {
			return slices.Contains(s.Codes, code)
		}
	}
	return false
}
