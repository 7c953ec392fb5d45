// Package knobs is the one registry of stage's process-wide switches: the
// test fault switches staged reads from its environment (STAGE_TEST_*).
// Every knob is listed here once, with its name and what it does (All;
// docs/OPERATIONS.md's "Test fault switches" table lists the same, and a
// test holds the two together). Parse reads them all once, when the
// config is loaded, and the values travel down from there (config.Config
// Knobs, the device options, node.Options): no constructor reads the
// environment itself, so a test sets a switch by passing a value, and a
// knob nobody passes is off.
//
// It imports nothing of stage. It is not for settings an operator tunes:
// those are config keys.
package knobs

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// The knobs' environment variables. e2e tests set them on staged
// processes: the names never change.
const (
	HostmemFailAfterEnv = "STAGE_TEST_HOSTMEM_FAIL_AFTER"
	FaultIPCImportEnv   = "STAGE_TEST_FAULT_IPC_IMPORT"
)

// Knob is one switch: its environment variable and what setting it does.
type Knob struct {
	Name string
	Doc  string
}

// All lists every knob, in the order of docs/OPERATIONS.md's table.
var All = []Knob{
	{HostmemFailAfterEnv, "an integer N >= 0: on a hostmem device, the N copies (gathers and scatters) after open succeed and the next one fails, once"},
	{FaultIPCImportEnv, "`1`: every import of a same-node peer's handle fails, so ipc transfers fall back to TCP with reason `import_failed`"},
}

// Values are the knobs as read once at start. The zero value has every
// knob off.
type Values struct {
	// HostmemFail arms hostmem's fault injection: HostmemFailAfter copies
	// succeed, the next one fails.
	HostmemFail      bool
	HostmemFailAfter int64
	// FaultIPCImport makes every same-node import of a peer's handle fail.
	FaultIPCImport bool

	set []string // "NAME=value" of each knob set, sorted
}

// Parse reads every knob from environ (os.Environ's NAME=value form; the
// first of a repeated name counts, as os.Getenv has it). A value that does
// not parse is an error naming the knob.
func Parse(environ []string) (Values, error) {
	env := map[string]string{}
	for _, kv := range environ {
		name, val, _ := strings.Cut(kv, "=")
		if _, dup := env[name]; !dup {
			env[name] = val
		}
	}
	var v Values
	for _, k := range All {
		if val, ok := env[k.Name]; ok {
			v.set = append(v.set, k.Name+"="+val)
		}
	}
	sort.Strings(v.set)
	if s := strings.TrimSpace(env[HostmemFailAfterEnv]); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return Values{}, fmt.Errorf("%s=%q: want an integer >= 0 (copies that succeed before one fails)", HostmemFailAfterEnv, env[HostmemFailAfterEnv])
		}
		v.HostmemFail, v.HostmemFailAfter = true, n
	}
	v.FaultIPCImport = env[FaultIPCImportEnv] == "1"
	return v, nil
}

// Set lists "NAME=value" of every knob in the environment Parse read,
// sorted, whatever its value: what staged logs at start, so that a switch
// left on is seen.
func (v Values) Set() []string { return v.set }
