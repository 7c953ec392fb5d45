// Package docs holds checks of the documentation against the code.
//
// TestPackageTable reads the package table of ARCHITECTURE.md and holds it
// against what `go list` reports for every Go module of the repository,
// and holds the packages under internal/ to importing only one another.
package docs

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// row is one line of the package table.
type row struct {
	line    int      // 1-based line in the file
	pkg     string   // the package column: a folder relative to the repository root
	imports []string // the "imports of ours" column; empty for "-"
}

// folderKind says what a row's folder is when no Go package lives there.
type folderKind int

const (
	folderMissing folderKind = iota // no such folder
	folderNoGo                      // a folder without Go files (python/, say): described, not checked
	folderGo                        // Go files, yet no package go list reported (build tags?)
)

// parseTable returns the rows of the first table under the "## Packages"
// heading of an ARCHITECTURE.md text.
func parseTable(text string) ([]row, error) {
	lines := strings.Split(text, "\n")
	i := slices.Index(lines, "## Packages")
	if i < 0 {
		return nil, errors.New(`no "## Packages" heading`)
	}
	for i++; i < len(lines) && !strings.HasPrefix(lines[i], "|"); i++ {
		if strings.HasPrefix(lines[i], "#") {
			return nil, errors.New(`no table under "## Packages"`)
		}
	}
	if i >= len(lines) {
		return nil, errors.New(`no table under "## Packages"`)
	}
	head := cells(lines[i])
	col := slices.Index(head, "imports of ours")
	if len(head) == 0 || head[0] != "package" || col < 0 {
		return nil, fmt.Errorf("line %d: the table's header %q lacks a package or an \"imports of ours\" column", i+1, lines[i])
	}
	var rows []row
	for i += 2; i < len(lines) && strings.HasPrefix(lines[i], "|"); i++ {
		c := cells(lines[i])
		if len(c) != len(head) {
			return nil, fmt.Errorf("line %d: %d cells, the header has %d", i+1, len(c), len(head))
		}
		r := row{line: i + 1, pkg: strings.Trim(c[0], "`")}
		if c[col] != "-" {
			for _, imp := range strings.Split(c[col], ",") {
				r.imports = append(r.imports, strings.Trim(strings.TrimSpace(imp), "`"))
			}
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// cells splits a table line into its trimmed cells.
func cells(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimSuffix(strings.TrimPrefix(line, "|"), "|")
	c := strings.Split(line, "|")
	for i := range c {
		c[i] = strings.TrimSpace(c[i])
	}
	return c
}

// diffTable lists every way the rows differ from pkgs (each package's
// imports of ours, by folder) and from the table's own rule that
// dependencies point down: a package's row comes above the rows of the
// packages it imports. folder says what a row's folder is when pkgs has no
// such package.
func diffTable(rows []row, pkgs map[string][]string, folder func(string) folderKind) []string {
	var out []string
	at := map[string]int{} // row index by package
	for i, r := range rows {
		if j, ok := at[r.pkg]; ok {
			out = append(out, fmt.Sprintf("line %d: %s has a row already (line %d)", r.line, r.pkg, rows[j].line))
			continue
		}
		at[r.pkg] = i
	}
	for i, r := range rows {
		if at[r.pkg] != i {
			continue
		}
		want, ok := pkgs[r.pkg]
		if !ok {
			switch folder(r.pkg) {
			case folderMissing:
				out = append(out, fmt.Sprintf("line %d: %s: no such folder", r.line, r.pkg))
			case folderGo:
				out = append(out, fmt.Sprintf("line %d: %s holds Go files but go list reports no package there", r.line, r.pkg))
			}
			continue
		}
		seen := map[string]bool{}
		for _, imp := range r.imports {
			switch {
			case seen[imp]:
				out = append(out, fmt.Sprintf("line %d: %s lists %s twice", r.line, r.pkg, imp))
			case !slices.Contains(want, imp):
				out = append(out, fmt.Sprintf("line %d: %s lists %s, which it does not import", r.line, r.pkg, imp))
			}
			seen[imp] = true
		}
		for _, imp := range want {
			if !seen[imp] {
				out = append(out, fmt.Sprintf("line %d: %s imports %s; its row does not list it", r.line, r.pkg, imp))
			}
			if j, ok := at[imp]; ok && j < i {
				out = append(out, fmt.Sprintf("line %d: %s imports %s, whose row is above it (line %d)", r.line, r.pkg, imp, rows[j].line))
			}
		}
	}
	var missing []string
	for p := range pkgs {
		if _, ok := at[p]; !ok {
			missing = append(missing, p)
		}
	}
	slices.Sort(missing)
	for _, p := range missing {
		out = append(out, fmt.Sprintf("%s has no row", p))
	}
	return out
}

// basement lists every import by which a package under internal/ reaches
// one of ours outside internal/. internal/ holds the house's shared
// helpers (the loader, the spin window, the knobs, a process launcher):
// anything may stand on them, so they stand on nothing above them, and the
// table's rule that dependencies point down keeps them at its foot.
func basement(pkgs map[string][]string) []string {
	var out []string
	for p, imps := range pkgs {
		if !internal(p) {
			continue
		}
		for _, imp := range imps {
			if !internal(imp) {
				out = append(out, fmt.Sprintf("%s imports %s: a package under internal/ imports only packages under internal/", p, imp))
			}
		}
	}
	slices.Sort(out)
	return out
}

// internal reports whether the folder p is under internal/.
func internal(p string) bool { return strings.HasPrefix(p, "internal/") }

// listed is what TestPackageTable reads of one package from go list -json.
type listed struct {
	ImportPath   string
	Dir          string
	GoFiles      []string
	CgoFiles     []string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// goList returns every package of every Go module under root by its folder
// relative to root, with its imports of packages among them: the imports
// of its non-test files or, for a package with no code outside its tests
// (at most a doc.go), those of its tests. The build is the default one for
// linux with cgo; GOFLAGS from the environment (-tags, say) are dropped, and
// nothing is downloaded.
func goList(t *testing.T, root string) map[string][]string {
	var mods []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		n := d.Name()
		if d.IsDir() && p != root && (n == "testdata" || n == "vendor" || strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_")) {
			return filepath.SkipDir
		}
		if n == "go.mod" && !d.IsDir() {
			mods = append(mods, filepath.Dir(p))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var all []listed
	for _, m := range mods {
		cmd := exec.Command("go", "list", "-e", "-json", "./...")
		cmd.Dir = m
		cmd.Env = append(os.Environ(), "GOOS=linux", "CGO_ENABLED=1", "GOFLAGS=", "GOWORK=off", "GOPROXY=off", "GOTOOLCHAIN=local")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list in %s: %v\n%s", m, err, stderr.Bytes())
		}
		for dec := json.NewDecoder(bytes.NewReader(out)); ; {
			var p listed
			if err := dec.Decode(&p); err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("go list in %s: %v", m, err)
			}
			all = append(all, p)
		}
	}
	rel := map[string]string{} // folder by import path
	for _, p := range all {
		r, err := filepath.Rel(root, p.Dir)
		if err != nil {
			t.Fatal(err)
		}
		rel[p.ImportPath] = filepath.ToSlash(r)
	}
	pkgs := map[string][]string{}
	for _, p := range all {
		imports := p.Imports
		if code := slices.DeleteFunc(slices.Concat(p.GoFiles, p.CgoFiles), func(f string) bool { return f == "doc.go" }); len(code) == 0 {
			imports = slices.Concat(p.TestImports, p.XTestImports)
		}
		ours := []string{}
		for _, imp := range imports {
			if r, ok := rel[imp]; ok && imp != p.ImportPath && !slices.Contains(ours, r) {
				ours = append(ours, r)
			}
		}
		pkgs[rel[p.ImportPath]] = ours
	}
	return pkgs
}

// TestPackageTable holds ARCHITECTURE.md's package table against go list:
// a row for every package and a package (or a folder without Go files, such
// as python/) for every row, each package's imports of ours exactly as
// listed, and no row importing a package whose row is above it.
func TestPackageTable(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile("ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	rows, err := parseTable(string(text))
	if err != nil {
		t.Fatalf("ARCHITECTURE.md: %v", err)
	}
	pkgs := goList(t, root)
	folder := func(rel string) folderKind {
		ents, err := os.ReadDir(filepath.Join(root, filepath.FromSlash(rel)))
		if err != nil {
			return folderMissing
		}
		for _, e := range ents {
			if strings.HasSuffix(e.Name(), ".go") {
				return folderGo
			}
		}
		return folderNoGo
	}
	for _, d := range diffTable(rows, pkgs, folder) {
		t.Errorf("ARCHITECTURE.md: %s", d)
	}
	for _, d := range basement(pkgs) {
		t.Errorf("go list: %s", d)
	}
}

// TestBasement checks that an import out of internal/ is reported, and
// imports into it or among its packages are not.
func TestBasement(t *testing.T) {
	tests := []struct {
		name string
		pkgs map[string][]string
		want []string
	}{
		{"into and among", map[string][]string{"client": {"wire", "internal/spin"}, "internal/a": {"internal/b"}, "internal/b": {}}, nil},
		{"out of internal", map[string][]string{"internal/h": {"wire", "client", "internal/b"}, "internal/b": {}, "internal2/c": {"client"}},
			[]string{"internal/h imports client: a package under internal/ imports only packages under internal/",
				"internal/h imports wire: a package under internal/ imports only packages under internal/"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := basement(tc.pkgs); !slices.Equal(got, tc.want) {
				t.Errorf("basement:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

// TestDiffTable checks that each kind of drift between a table and go list
// is reported, and that a table that matches reports nothing.
func TestDiffTable(t *testing.T) {
	pkgs := map[string][]string{
		"cmd/x":  {"a", "b"},
		"a":      {"b"},
		"b":      {},
		"e2e":    {"a"},
		"nested": {},
	}
	good := "| `cmd/x` | the binary | a, b |\n| `e2e` | tests | `a` |\n| `a` | a | b |\n| `b` | b | - |\n| `nested` | own module | - |\n| `python/` | not Go | - |\n"
	folders := map[string]folderKind{"python/": folderNoGo, "tagged": folderGo}
	folder := func(rel string) folderKind { return folders[rel] }
	tests := []struct {
		name string
		body string // the table's rows
		want []string
	}{
		{"matches", good, nil},
		{"import not listed",
			strings.Replace(good, "| a | b |", "| a | - |", 1),
			[]string{"line 11: a imports b; its row does not list it"}},
		{"import listed but absent",
			strings.Replace(good, "| `b` | b | - |", "| `b` | b | a |", 1),
			[]string{"line 12: b lists a, which it does not import"}},
		{"import listed twice",
			strings.Replace(good, "| a, b |", "| a, b, a |", 1),
			[]string{"line 9: cmd/x lists a twice"}},
		{"package without a row",
			strings.Replace(good, "| `nested` | own module | - |\n", "", 1),
			[]string{"nested has no row"}},
		{"row without a folder",
			good + "| `gone` | removed | - |\n",
			[]string{"line 15: gone: no such folder"}},
		{"row of Go files go list skipped",
			good + "| `tagged` | build tags | - |\n",
			[]string{"line 15: tagged holds Go files but go list reports no package there"}},
		{"row twice",
			good + "| `b` | again | - |\n",
			[]string{"line 15: b has a row already (line 12)"}},
		{"dependency above its importer",
			"| `cmd/x` | the binary | a, b |\n| `e2e` | tests | `a` |\n| `b` | b | - |\n| `a` | a | b |\n| `nested` | own module | - |\n",
			[]string{"line 12: a imports b, whose row is above it (line 11)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			text := "# Architecture\n\n## Packages\n\nIntro.\n\n| package | what it does | imports of ours |\n|---|---|---|\n" + tc.body + "\n## Memory\n"
			rows, err := parseTable(text)
			if err != nil {
				t.Fatal(err)
			}
			if got := diffTable(rows, pkgs, folder); !slices.Equal(got, tc.want) {
				t.Errorf("diffTable:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

// TestParseTableRefuses checks that a page without a table parseTable
// understands is an error, not an empty table that would match nothing.
func TestParseTableRefuses(t *testing.T) {
	tests := []struct {
		name, text string
	}{
		{"no heading", "# Architecture\n\n| package | what it does | imports of ours |\n|---|---|---|\n"},
		{"no table", "## Packages\n\nText.\n\n## Memory\n\n| package | what it does | imports of ours |\n"},
		{"no imports column", "## Packages\n\n| package | what it does |\n|---|---|\n| `a` | a |\n"},
		{"short row", "## Packages\n\n| package | what it does | imports of ours |\n|---|---|---|\n| `a` | a |\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if rows, err := parseTable(tc.text); err == nil {
				t.Errorf("parseTable gave %d rows and no error", len(rows))
			}
		})
	}
}
