package snippets_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/ticketing-dev/ticketing/integration/harness"
	"github.com/ticketing-dev/ticketing/server"
)

// TestServeFlagsDocumented: every flag of 'ticketingd serve --help' is in
// docs/operations.md's settings table, and the README, which lists no
// flags (a newcomer reads the commands, not forty settings), points there.
func TestServeFlagsDocumented(t *testing.T) {
	bin, err := harness.BuildBinaries(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	help, err := exec.Command(bin, "serve", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("serve --help: %v\n%s", err, help)
	}
	flags := regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z][a-z-]*)`).FindAllStringSubmatch(string(help), -1)
	if len(flags) < 20 {
		t.Fatalf("%d flags in serve --help, want 20 or more:\n%s", len(flags), help)
	}
	readme, ops := readDoc(t, "README.md"), readDoc(t, "docs/operations.md")
	if !strings.Contains(readme, "(docs/operations.md#ticketingd-serve)") || !strings.Contains(ops, "\n## `ticketingd serve`\n") {
		t.Error("README.md does not point at docs/operations.md's `ticketingd serve` section")
	}
	for _, f := range flags {
		name := f[1]
		if name == "help" {
			continue
		}
		if !strings.Contains(ops, "| `"+name+"` |") && !strings.Contains(ops, "| `--"+name) && !strings.Contains(ops, "`"+name+"`, `") {
			t.Errorf("docs/operations.md's settings table has no %s", name)
		}
	}
}

// TestStatusExampleComplete: the /status example of docs/operations.md has
// every field of server.Stats that is always present, may have those
// omitted when empty, and no other but "build", which ticketingd adds (the binary's build, TestVersionBinary in
// cmd/ticketingd).
func TestStatusExampleComplete(t *testing.T) {
	ops := readDoc(t, "docs/operations.md")
	_, after, ok := strings.Cut(ops, "`/status`:\n\n```json\n")
	example, _, ok2 := strings.Cut(after, "```")
	if !ok || !ok2 {
		t.Fatal("docs/operations.md: no /status example")
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(example), &got); err != nil {
		t.Fatalf("the /status example is not JSON: %v", err)
	}
	st := reflect.TypeFor[server.Stats]()
	want := map[string]bool{} // true: always present; false: omitted when empty
	for i := range st.NumField() {
		name, opts, _ := strings.Cut(st.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			want[name] = !strings.Contains(opts, "omitempty")
		}
	}
	want["build"] = true
	for k, always := range want {
		if _, ok := got[k]; !ok && always {
			t.Errorf("the /status example lacks %q", k)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("the /status example has %q, which server.Stats does not", k)
		}
	}
}

func readDoc(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile("../../" + path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDocsStandAlone: no document or doc comment of the module points at a
// file outside the repository (the design notes it was built from).
func TestDocsStandAlone(t *testing.T) {
	outside := regexp.MustCompile(`shared/|SEMANTICS\.md|PROTOCOL\.md|STYLE\.md|seed 0\d\d`)
	root := "../.."
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); name != ".." && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		if strings.HasSuffix(path, "_test.go") ||
			(!strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, ".md")) {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if outside.MatchString(line) {
				t.Errorf("%s:%d points outside the repository: %s", rel, i+1, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestOutcomeTableComplete: every error sentinel of package broker (the
// exported Err* variables of broker/errors.go) is named in the README's
// "Outcomes and what to do with each" section, so that a caller who gets
// one finds what to do with it. ErrInvalidConfig is New's alone (the
// tour's "only an invalid configuration fails here").
func TestOutcomeTableComplete(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "../../broker/errors.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.VAR {
			continue
		}
		for _, spec := range gd.Specs {
			for _, n := range spec.(*ast.ValueSpec).Names {
				if strings.HasPrefix(n.Name, "Err") && n.IsExported() && n.Name != "ErrInvalidConfig" {
					names = append(names, n.Name)
				}
			}
		}
	}
	if len(names) < 10 {
		t.Fatalf("found %d sentinels in broker/errors.go: %v", len(names), names)
	}
	readme := readDoc(t, "README.md")
	start := strings.Index(readme, "### Outcomes and what to do with each")
	if start < 0 {
		t.Fatal(`README.md has no "### Outcomes and what to do with each" section`)
	}
	section := readme[start:]
	if end := strings.Index(section[4:], "\n#"); end >= 0 {
		section = section[:4+end]
	}
	for _, n := range names {
		if !regexp.MustCompile(`broker\.` + n + `\b`).MatchString(section) {
			t.Errorf("the README's outcome section does not name broker.%s", n)
		}
	}
}

// TestReleaseFiles: what a newcomer installing the module needs is there:
// the license (Apache-2.0), a changelog in Keep a Changelog form with an
// Unreleased section, upgrade steps that point at it (not at "release
// notes" that do not exist), and relative links in the README and docs/
// that lead to files of the repository.
func TestReleaseFiles(t *testing.T) {
	license := readDoc(t, "LICENSE")
	if !strings.Contains(license, "Apache License\n                           Version 2.0, January 2004") ||
		!strings.Contains(license, "END OF TERMS AND CONDITIONS") {
		t.Error("LICENSE is not the Apache License 2.0 text")
	}
	changelog := readDoc(t, "CHANGELOG.md")
	for _, want := range []string{"keepachangelog.com", "\n## [Unreleased]\n", "\n### Added\n"} {
		if !strings.Contains(changelog, want) {
			t.Errorf("CHANGELOG.md lacks %q", want)
		}
	}
	ops := readDoc(t, "docs/operations.md")
	if strings.Contains(ops, "release notes") || !strings.Contains(ops, "(../CHANGELOG.md)") {
		t.Error("docs/operations.md's upgrade steps do not point at CHANGELOG.md")
	}
	readme := readDoc(t, "README.md")
	if !strings.Contains(readme, "go install ./cmd/ticketingd") || !strings.Contains(readme, "(LICENSE)") {
		t.Error("README.md's Install section does not say how to build from a clone, or does not name the license")
	}
	docs, _ := filepath.Glob("../../docs/*.md")
	link := regexp.MustCompile(`\]\(([^)#:\s]+)(#[^)]*)?\)`)
	for _, doc := range append(docs, "../../README.md", "../../CHANGELOG.md") {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			if _, err := os.Stat(filepath.Join(filepath.Dir(doc), m[1])); err != nil {
				t.Errorf("%s links to %s, which does not exist", strings.TrimPrefix(doc, "../../"), m[1])
			}
		}
	}
}

// TestSpeaksOfItself: the repository describes the product, not how it
// was made. No text file (code, tests, docs, scripts, test data notes)
// names a step of its development or a tracker number, a design page or
// client library it was derived from, a numbered rule of a document
// outside the repository, a figure someone aimed at and whether it was
// reached, or who asked for a change. Each hit is reported as file:line.
func TestSpeaksOfItself(t *testing.T) {
	banned := []*regexp.Regexp{
		regexp.MustCompile(`\b[Ss]ession \d+\b`),
		regexp.MustCompile(`\b[Ii]ssues? #?\d+\b`),
		regexp.MustCompile(`\b[Ss]eed (pages?|0\d\d)\b`),
		regexp.MustCompile(`\((missed|met|not met)\)`),
		regexp.MustCompile(`\b(Ruby|Rust)( and (Ruby|Rust))? (client|librar|page|gem|crate)`),
		regexp.MustCompile(`\b[Rr]ules? \d+(-\d+)?\b`),
		regexp.MustCompile(`\b[Bb]ehaviou?rs? \d+\b`),
		regexp.MustCompile(`\b[Gg]oals?\b`),
		regexp.MustCompile(`\b([Ii]tems?|[Ff]indings?) \d+\b|\b[Hh]ardening round|\b[Rr]eviewers?\b|\bfound in review\b`),
	}
	text := map[string]bool{".go": true, ".md": true, ".sh": true, ".yaml": true, ".yml": true,
		".txt": true, ".sql": true, ".js": true, ".html": true, ".css": true, ".golden": true}
	root := "../.."
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if name := d.Name(); name == ".git" || name == "fuzz" || name == "node_modules" {
				return filepath.SkipDir
			}
			return nil
		}
		if !text[filepath.Ext(path)] && filepath.ToSlash(rel) != ".ci/run" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, re := range banned {
				if m := re.FindString(line); m != "" {
					t.Errorf("%s:%d: %q speaks of how the product was made, not of the product: %s",
						filepath.ToSlash(rel), i+1, m, strings.TrimSpace(line))
					break
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestReadmeShort: the README stays a user's page of at most 1,500 words
// (as wc -w counts them); detail belongs in docs/ and bench/RESULTS.md.
func TestReadmeShort(t *testing.T) {
	const most = 1500
	if n := len(strings.Fields(readDoc(t, "README.md"))); n > most {
		t.Errorf("README.md has %d words, more than %d: move detail to docs/", n, most)
	}
}
