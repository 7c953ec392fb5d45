package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// fileRef is a backticked file name in a document: a path or a bare name,
// ending in one of the repository's source suffixes.
var fileRef = regexp.MustCompile("`([A-Za-z0-9_./-]+\\.(?:go|py|sh|c|cu|yaml))`")

// staleRefs lists the file names text names that no file of files ends
// with, with the line of each. A document names files by their path from
// the root, from the package it is speaking of (proxy/'s files bare), or by
// their name alone, so a name counts as present when some file's path ends
// with it at a folder boundary.
func staleRefs(text string, files []string) []string {
	var stale []string
	for i, line := range strings.Split(text, "\n") {
		for _, m := range fileRef.FindAllStringSubmatch(line, -1) {
			name := strings.TrimPrefix(m[1], "./")
			found := false
			for _, f := range files {
				if f == name || strings.HasSuffix(f, "/"+name) {
					found = true
					break
				}
			}
			if !found {
				stale = append(stale, m[1]+" (line "+strconv.Itoa(i+1)+")")
			}
		}
	}
	return stale
}

func TestStaleRefs(t *testing.T) {
	files := []string{"proxy/send_submit.go", "acl/testdata/fakeacl.c", "python/stage_client/mover.py"}
	for _, c := range []struct {
		text string
		want []string
	}{
		{"`send_submit.go` and `proxy/send_submit.go`", nil},
		{"`testdata/fakeacl.c`, `stage_client/mover.py`", nil},
		{"`submit.go`", []string{"submit.go (line 1)"}}, // a suffix, not a whole name
		{"one\n`proxy/gone.go`", []string{"proxy/gone.go (line 2)"}},
		{"`mover.py` `not a file` `x.txt`", nil},
	} {
		got := staleRefs(c.text, files)
		if strings.Join(got, "|") != strings.Join(c.want, "|") {
			t.Errorf("staleRefs(%q) = %q, want %q", c.text, got, c.want)
		}
	}
}

// TestArchitectureNamesFiles holds ARCHITECTURE.md to naming only files
// that exist: a file renamed, split or removed must take the document's
// pointers with it.
func TestArchitectureNamesFiles(t *testing.T) {
	var files []string
	err := filepath.WalkDir("..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != ".." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "build" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if !d.IsDir() {
			files = append(files, filepath.ToSlash(strings.TrimPrefix(p, "../")))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile("ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range staleRefs(string(text), files) {
		t.Errorf("ARCHITECTURE.md names %s, which no file of the repository is", s)
	}
}
