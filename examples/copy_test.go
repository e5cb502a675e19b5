// Package examples_test checks that each example directory works as the
// README offers it: copied whole, tests included, into a module of one's
// own.
package examples_test

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// copyable are the example directories a user may copy into a module of
// their own.
var copyable = []string{"quickstart", "httpapi", "worker", "longjob"}

// notInCopies are module paths that a copied example must not require (its
// go.mod) nor build or vet with (its packages and tests, and everything
// they import): the repository's own test machinery (containers and what
// they bring), which the examples' tests must not import.
var notInCopies = []string{"testcontainers", "github.com/docker/", "github.com/moby/", "go.opentelemetry.io/"}

// TestExamplesCopy copies each example directory into a new module
// (example.com/copy) that requires this repository through a replace
// directive, as the README's Install section says to use it before the
// module is published, and runs go mod tidy, go build ./... and go vet
// ./... there (vet type-checks the tests too). Neither the copy's go.mod,
// nor its go.sum, nor the packages its build and tests load (go list
// -deps -test) may come from notInCopies. Before, the tests of httpapi and
// worker imported examples/internal/examplestest and internal/testdb,
// which a module outside the repository may not import, so go vet failed,
// and through them tidy required testcontainers, docker and otel. And the
// copy's go.sum listed those modules (42 lines): go mod tidy keeps
// checksums for the tests of the packages a module imports, and the tests
// of migrations and migrations/pgxmigrations import internal/testdb, which
// imported testcontainers; its container source is now a package of its
// own (internal/testdb/containerdb) that only the container tests import.
// It skips only when the go command is missing, and never when CI=true.
func TestExamplesCopy(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the go command is not on PATH (required when CI=true): %v", err)
		}
		t.Skipf("the go command is not on PATH: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range copyable {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), name)
			copyDir(t, filepath.Join(root, "examples", name), dir)
			run := func(args ...string) string {
				t.Helper()
				cmd := exec.CommandContext(t.Context(), goCmd, args...)
				cmd.Dir = dir
				cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("go %s in a copy of examples/%s: %v\n%s", strings.Join(args, " "), name, err, out)
				}
				return string(out)
			}
			run("mod", "init", "example.com/copy")
			run("mod", "edit", "-require", "github.com/ticketing-dev/ticketing@v0.0.0",
				"-replace", "github.com/ticketing-dev/ticketing="+root)
			run("mod", "tidy")
			run("build", "./...")
			run("vet", "./...")
			gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
			if err != nil {
				t.Fatal(err)
			}
			deps := run("list", "-deps", "-test", "-f", "{{if .Module}}{{.Module.Path}} {{end}}{{.ImportPath}}", "./...")
			gosum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
			if err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			for _, bad := range notInCopies {
				if strings.Contains(string(gomod), bad) {
					t.Errorf("a copy of examples/%s requires %s in its go.mod", name, bad)
				}
				n := 0
				for l := range strings.Lines(string(gosum)) {
					if strings.Contains(l, bad) {
						n++
					}
				}
				if n > 0 {
					t.Errorf("a copy of examples/%s has %d lines of %s in its go.sum", name, n, bad)
				}
				for l := range strings.Lines(deps) {
					if strings.Contains(l, bad) {
						t.Errorf("a copy of examples/%s builds or tests with %s", name, strings.TrimSpace(l))
					}
				}
			}
		})
	}
}

// copyDir copies the regular files under src to dst.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}
