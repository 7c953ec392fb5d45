package knobs

import (
	"os"
	"slices"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		environ []string
		want    Values
		wantErr string // in the error; "" for none
	}{
		{"none", []string{"PATH=/bin", "STAGE_TEST_OTHER=1"}, Values{}, ""},
		{"fail after 0", []string{HostmemFailAfterEnv + "=0"},
			Values{HostmemFail: true, set: []string{HostmemFailAfterEnv + "=0"}}, ""},
		{"fail after 5, padded", []string{HostmemFailAfterEnv + "= 5 "},
			Values{HostmemFail: true, HostmemFailAfter: 5, set: []string{HostmemFailAfterEnv + "= 5 "}}, ""},
		{"fail after empty: off", []string{HostmemFailAfterEnv + "= "}, Values{set: []string{HostmemFailAfterEnv + "= "}}, ""},
		{"first of a repeated name", []string{HostmemFailAfterEnv + "=2", HostmemFailAfterEnv + "=x"},
			Values{HostmemFail: true, HostmemFailAfter: 2, set: []string{HostmemFailAfterEnv + "=2"}}, ""},
		{"fail after negative", []string{HostmemFailAfterEnv + "=-1"}, Values{}, HostmemFailAfterEnv + `="-1": want an integer >= 0`},
		{"fail after text", []string{HostmemFailAfterEnv + "=soon"}, Values{}, HostmemFailAfterEnv + `="soon"`},
		{"import 1", []string{FaultIPCImportEnv + "=1"}, Values{FaultIPCImport: true, set: []string{FaultIPCImportEnv + "=1"}}, ""},
		{"import other than 1: off", []string{FaultIPCImportEnv + "=true"}, Values{set: []string{FaultIPCImportEnv + "=true"}}, ""},
		{"both, sorted", []string{HostmemFailAfterEnv + "=3", FaultIPCImportEnv + "=1"},
			Values{HostmemFail: true, HostmemFailAfter: 3, FaultIPCImport: true,
				set: []string{FaultIPCImportEnv + "=1", HostmemFailAfterEnv + "=3"}}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.environ)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %+v, %v; want an error holding %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.HostmemFail != tc.want.HostmemFail || got.HostmemFailAfter != tc.want.HostmemFailAfter ||
				got.FaultIPCImport != tc.want.FaultIPCImport || !slices.Equal(got.Set(), tc.want.set) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// Every knob is in docs/OPERATIONS.md's table of test fault switches, and
// the table names no knob this package does not know.
func TestOperationsListsEveryKnob(t *testing.T) {
	b, err := os.ReadFile("../../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	var documented []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "| `STAGE_TEST_") {
			name, _, _ := strings.Cut(strings.TrimPrefix(line, "| `"), "`")
			documented = append(documented, name)
		}
	}
	var names []string
	for _, k := range All {
		names = append(names, k.Name)
	}
	if !slices.Equal(documented, names) {
		t.Errorf("docs/OPERATIONS.md's test fault switches table lists %v, the registry %v (same order)", documented, names)
	}
}
