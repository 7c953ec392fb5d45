package proxy

import (
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The session is the link (control connection, lifecycle, send) and its
// data streams; what moves on it lives in its halves, each with its own
// lock (recv_inbound.go, send_answertable.go; issue 36). This holds the
// split: fewer than 20 methods on session, and its own lock taken only
// where the link is kept. Counted from the package's source with go/types
// (imports stubbed: only the package's own names need resolving, so a
// lock on a value typed through an import, as in gnet's OnOpen, is not
// seen); -v prints the counts of each type.
func TestSessionIsTheLink(t *testing.T) {
	fset := token.NewFileSet()
	var files []*ast.File
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	info := &types.Info{Selections: map[*ast.SelectorExpr]*types.Selection{}}
	conf := types.Config{Importer: stubImporter{}, Error: func(error) {}} // unresolved imports are expected
	pkg, _ := conf.Check("proxy", fset, files, info)

	const maxMethods = 20
	linkFiles := []string{"control.go", "handshake.go", "routes.go", "session.go"}
	for _, tc := range []struct {
		typ        string
		maxMethods int      // 0: not bounded here
		lockFiles  []string // the only files that may lock its mu; nil: any
	}{
		{"session", maxMethods, linkFiles},
		{"inbound", 0, []string{"recv_inbound.go"}},
		{"answerTable", 0, []string{"send_answertable.go"}},
		{"streamSet", 0, []string{"streams.go"}},
	} {
		obj := pkg.Scope().Lookup(tc.typ)
		if obj == nil {
			t.Fatalf("no type %s in package proxy", tc.typ)
		}
		named := obj.Type().(*types.Named)
		var mu *types.Var
		st := named.Underlying().(*types.Struct)
		for i := range st.NumFields() {
			if st.Field(i).Name() == "mu" {
				mu = st.Field(i)
			}
		}
		sites := map[string]int{}
		for _, f := range files {
			file := filepath.Base(fset.Position(f.Pos()).Filename)
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok || sel.Sel.Name != "Lock" {
					return true
				}
				if inner, ok := sel.X.(*ast.SelectorExpr); ok && mu != nil {
					if s := info.Selections[inner]; s != nil && s.Obj() == mu {
						sites[file]++
					}
				}
				return true
			})
		}
		n := 0
		for _, c := range sites {
			n += c
		}
		t.Logf("%-12s %2d methods; its mu locked at %2d sites in %v", tc.typ, named.NumMethods(), n, sites)
		if tc.maxMethods > 0 && named.NumMethods() >= tc.maxMethods {
			t.Errorf("%s has %d methods, want fewer than %d: what is not the link goes to a half (inbound, answerTable) or the streams (streamSet)",
				tc.typ, named.NumMethods(), tc.maxMethods)
		}
		for file := range sites {
			if tc.lockFiles != nil && !slices.Contains(tc.lockFiles, file) {
				t.Errorf("%s.mu locked in %s; only %v may: a table with its own lock keeps its own state", tc.typ, file, tc.lockFiles)
			}
		}
	}
}

// stubImporter gives every import an empty package: the count needs only
// the package's own types.
type stubImporter struct{}

func (stubImporter) Import(path string) (*types.Package, error) {
	if path == "unsafe" {
		return importer.Default().Import(path)
	}
	p := types.NewPackage(path, filepath.Base(path))
	p.MarkComplete()
	return p, nil
}
