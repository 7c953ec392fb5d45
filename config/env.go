package config

import (
	"sort"
	"strings"
)

// TestEnvPrefix starts the environment variables reserved for tests: fault
// switches that make staged fail on purpose (registered in internal/knobs,
// read once by Load) and the knobs of test programs. They are no config keys and never set one.
const TestEnvPrefix = EnvPrefix + "_TEST_"

// renamedEnv maps environment variables of earlier releases to what
// replaced them, for the warning about unknown variables.
var renamedEnv = map[string]string{
	"STAGE_CUDA_LIBRARY":       "STAGE_DEVICE_CUDA_LIBRARY (device.cuda.library)",
	"STAGE_CUDA_COPY":          "STAGE_DEVICE_CUDA_COPY_MODE (device.cuda.copy_mode)",
	"STAGE_CUDA_EVENT_WAIT":    "STAGE_DEVICE_CUDA_EVENT_WAIT (device.cuda.event_wait)",
	"STAGE_CUDA_PTX":           "STAGE_DEVICE_CUDA_PTX (device.cuda.ptx)",
	"STAGE_ACL_LIBRARY":        "STAGE_DEVICE_ACL_LIBRARY (device.acl.library)",
	"STAGE_ACL_COPY":           "STAGE_DEVICE_ACL_COPY_MODE (device.acl.copy_mode)",
	"STAGE_HIP_LIBRARY":        "STAGE_DEVICE_HIP_LIBRARY (device.hip.library)",
	"STAGE_HOSTMEM_FAIL_AFTER": "STAGE_TEST_HOSTMEM_FAIL_AFTER (a test fault switch)",
	"STAGE_FAULT_IPC_IMPORT":   "STAGE_TEST_FAULT_IPC_IMPORT (a test fault switch)",
}

// EnvName returns the environment variable that sets key:
// "staging.slot_size" -> "STAGE_STAGING_SLOT_SIZE".
func EnvName(key string) string {
	return EnvPrefix + "_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// UnknownEnv is one STAGE_* variable that sets nothing.
type UnknownEnv struct {
	Name string // the variable
	Hint string // what replaced it, when it was renamed; else ""
}

func (u UnknownEnv) String() string {
	if u.Hint != "" {
		return u.Name + " (renamed: use " + u.Hint + ")"
	}
	return u.Name
}

// UnknownEnvVars returns, sorted by name, the STAGE_* variables of environ
// (os.Environ's NAME=value form) that set no config key and are not
// reserved for tests: a typo, or a name of an earlier release, that would
// otherwise be ignored without a word. staged warns about each at start.
func UnknownEnvVars(environ []string) []UnknownEnv {
	known := map[string]bool{}
	for _, k := range LeafKeys() {
		known[EnvName(k)] = true
	}
	var out []UnknownEnv
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, EnvPrefix+"_") || strings.HasPrefix(name, TestEnvPrefix) || known[name] {
			continue
		}
		out = append(out, UnknownEnv{Name: name, Hint: renamedEnv[name]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
