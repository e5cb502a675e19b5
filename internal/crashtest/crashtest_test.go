package crashtest

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestOnlyTestsImport checks that no Go file of the tree (both modules)
// but a _test.go file imports this package: it imports testing, and kills
// processes.
func TestOnlyTestsImport(t *testing.T) {
	const self = "github.com/ticketing-dev/ticketing/internal/crashtest"
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	seen := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		seen++
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == self {
				t.Errorf("%s imports %s: only tests may", path, self)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen < 10 {
		t.Fatalf("only %d non-test Go files under %s: not the module's tree?", seen, root)
	}
}

// TestLines checks how a child's lines move what the store must and may
// hold.
func TestLines(t *testing.T) {
	a := &acked{terms: map[uint64]uint64{}}
	for _, l := range []string{"ready 0", "store 1 10 3", "log 10", "stable 10", "store 11 20 3", "log 20", "truncating 15"} {
		if _, err := a.line(l); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
	}
	if a.log != 15 || a.stable != 10 || len(a.terms) != 20 || a.maxTerm != 3 || !a.truncating {
		t.Fatalf("before trunc: %+v", a)
	}
	if _, err := a.line("trunc 15"); err != nil {
		t.Fatal(err)
	}
	if len(a.terms) != 15 || a.truncations != 1 || len(a.stableMay) != 2 {
		t.Fatalf("after trunc: %+v", a)
	}
	for _, bad := range []string{"err StoreLogs: boom", "log", "log x", "store 1 2", "what 1"} {
		if _, err := a.line(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
