package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/ticketing-dev/ticketing/server/admin"
)

// TestVersionBinary builds the real binary as a user does, from this
// checkout, and checks that 'ticketingd version' and 'ticketingd
// --version' print the module version, the VCS revision and whether the
// tree was modified, as git sees them, and the Go version; and that a
// running server's /status ("build") and ticketing_build_info metric say
// the same. The go command stamps VCS information only in a git clone
// whose .git is a directory (not in a git worktree, whose .git is a
// file, nor with git missing): there the revision must be HEAD's;
// elsewhere the binary must say that it does not know. Before, version
// printed "ticketingd dev" whatever the build, and --version was an
// unknown flag.
func TestVersionBinary(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "ticketingd")
	// -buildvcs=auto: the default, given explicitly over any GOFLAGS.
	if out, err := exec.Command("go", "build", "-buildvcs=auto", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var wantRev, wantModified, wantVersion string
	fi, statErr := os.Stat(filepath.Join(root, ".git"))
	_, gitErr := exec.LookPath("git")
	if statErr == nil && fi.IsDir() && gitErr == nil {
		head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
		if err != nil {
			t.Fatalf("git rev-parse HEAD: %v", err)
		}
		status, err := exec.Command("git", "-C", root, "status", "--porcelain").Output()
		if err != nil {
			t.Fatalf("git status: %v", err)
		}
		wantRev = strings.TrimSpace(string(head))
		wantModified = "false"
		if len(strings.TrimSpace(string(status))) > 0 {
			wantModified = "true"
		}
		// A pseudo-version of HEAD (the module has no tags yet) or a tag.
		wantVersion = `v\d+\.\d+\.\d+\S*`
		t.Logf("a git clone: want revision %s, modified %s", wantRev, wantModified)
	} else {
		wantRev, wantModified, wantVersion = "unknown", "unknown", regexp.QuoteMeta(develVersion)
		t.Logf("not a git clone with a .git directory (%v, git: %v): want no VCS information", statErr, gitErr)
	}

	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, err := exec.Command(bin, args...).Output()
		if err != nil {
			t.Fatalf("ticketingd %s: %v", args[0], err)
		}
		for _, re := range []string{
			`(?m)^ticketingd ` + wantVersion + `$`,
			`(?m)^module: +github\.com/ticketing-dev/ticketing$`,
			`(?m)^revision: ` + regexp.QuoteMeta(wantRev) + `( |$)`,
			`(?m)^modified: ` + wantModified + `$`,
			`(?m)^go: +` + regexp.QuoteMeta(runtime.Version()) + ` `,
		} {
			if !regexp.MustCompile(re).Match(out) {
				t.Errorf("ticketingd %s: no line matching %s in:\n%s", args[0], re, out)
			}
		}
		if wantRev != "unknown" && !strings.Contains(string(out), wantRev[:12]) {
			t.Errorf("ticketingd %s: the version does not name the revision %s:\n%s", args[0], wantRev[:12], out)
		}
	}

	sp := startBinary(t, bin, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--data-dir", t.TempDir(), "--log-format", "json")
	adminURL := "http://" + sp.stderr.waitJSON(t, "admin listening", sp.done)["addr"].(string)
	listening := sp.stderr.waitJSON(t, "listening", sp.done)
	code, body := httpGet(t, adminURL+"/status")
	var st admin.Status
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil {
		t.Fatalf("/status: %d %v %s", code, err, body)
	}
	b := buildInfo(st.Build)
	if !regexp.MustCompile(`^`+wantVersion+`$`).MatchString(b.Version) || b.GoVersion != runtime.Version() ||
		(b.Revision == "" && wantRev != "unknown") || (b.Revision != "" && b.Revision != wantRev) || b.modifiedLabel() != wantModified {
		t.Errorf("/status build: %+v (modified %s), want version %s, revision %s, modified %s", b, b.modifiedLabel(), wantVersion, wantRev, wantModified)
	}
	if listening["version"] != b.Version {
		t.Errorf("listening log line: version %v, /status %s", listening["version"], b.Version)
	}
	_, metrics := httpGet(t, adminURL+"/metrics")
	want := `ticketing_build_info{go_version="` + runtime.Version() + `",modified="` + wantModified +
		`",revision="` + wantRev + `",version="` + b.Version + `"} 1`
	if !strings.Contains(metrics, want) {
		t.Errorf("/metrics lacks %s; it has:\n%s", want, grepLines(metrics, "build_info"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for l := range strings.Lines(s) {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "")
}

// newBuildInfo reads the go command's stamp; main.version, set with
// -ldflags -X, overrides the module version.
func TestNewBuildInfo(t *testing.T) {
	bi := &debug.BuildInfo{
		Main: debug.Module{Path: "example.com/m", Version: "v1.2.3"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.time", Value: "2026-01-02T03:04:05Z"}, {Key: "vcs.modified", Value: "true"},
		},
	}
	got := newBuildInfo(bi)
	if got.Version != "v1.2.3" || got.Path != "example.com/m" || got.Revision != "abc" || got.modifiedLabel() != "true" ||
		!strings.Contains(got.String(), "revision: abc (2026-01-02T03:04:05Z)\n") {
		t.Errorf("newBuildInfo: %+v\n%s", got, got)
	}
	if got := newBuildInfo(nil); got.Version != develVersion || got.Revision != "" || got.modifiedLabel() != "unknown" {
		t.Errorf("newBuildInfo(nil): %+v", got)
	}
	old := version
	version = "v9.9.9"
	defer func() { version = old }()
	if got := newBuildInfo(bi); got.Version != "v9.9.9" || got.Revision != "abc" {
		t.Errorf("with main.version set: %+v", got)
	}
}
