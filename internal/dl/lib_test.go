package dl

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

func TestLoad(t *testing.T) {
	so := buildLib(t, "int have_a(void) { return 1; }\nint have_b(void) { return 2; }\n")
	gone := filepath.Join(t.TempDir(), "nope.so")
	reason := func(group int, name string) string { return "costs " + name }
	tests := []struct {
		name       string
		path       string
		table      []Sym
		wantErr    []string // what the error must hold; nil for none
		wantAbsent []string
		wantBound  []int // table indices Set was given
	}{
		{"all present", so, []Sym{{"have_a", Required}, {"have_b", 1}}, nil, nil, []int{0, 1}},
		{"optional absent", so, []Sym{{"have_a", Required}, {"nope_x", 1}, {"have_b", 2}},
			nil, []string{"nope_x: costs nope_x"}, []int{0, 2}},
		{"required absent: every one named", so, []Sym{{"nope_x", Required}, {"have_a", Required}, {"nope_y", Required}, {"nope_z", 1}},
			[]string{"t: " + so + ": missing nope_x, nope_y; too old?"}, nil, nil},
		{"no such file", gone, []Sym{{"have_a", Required}}, []string{"t: dlopen " + gone + ": ", "; install it"}, nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var bound []int
			l, err := Load(tc.path, Binding{Lib: "t", Install: "install it", TooOld: "too old?", Table: tc.table,
				Set:    func(i int, p unsafe.Pointer) { bound = append(bound, i) },
				Absent: reason})
			if tc.wantErr != nil {
				if err == nil {
					l.Close()
					t.Fatalf("got a library, want an error holding %q", tc.wantErr)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("got %q, want it to hold %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if l.Path() != tc.path {
				t.Errorf("Path() = %q, want %q", l.Path(), tc.path)
			}
			if got := l.AbsentList(); !slices.Equal(got, tc.wantAbsent) {
				t.Errorf("AbsentList() = %q, want %q", got, tc.wantAbsent)
			}
			if !slices.Equal(bound, tc.wantBound) {
				t.Errorf("Set got indices %v, want %v", bound, tc.wantBound)
			}
			if len(tc.wantAbsent) > 0 && !slices.Equal(l.Missing(1), []string{"nope_x"}) {
				t.Errorf("Missing(1) = %q, want [nope_x]", l.Missing(1))
			}
		})
	}
}
