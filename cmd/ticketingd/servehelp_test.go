package main

import (
	"io"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// TestServeFlagGroups: every flag of 'ticketingd serve' (but cobra's
// --help) belongs to exactly one group of its --help, so a new setting
// cannot be left out; --help lists each flag once, under its heading.
func TestServeFlagGroups(t *testing.T) {
	cmd := newServeCmd(io.Discard)
	in := map[string]int{}
	for _, g := range serveFlagGroups {
		for _, name := range g.flags {
			in[name]++
		}
	}
	n := 0
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" {
			return
		}
		n++
		if got := f.Annotations[flagGroupAnnotation]; len(got) != 1 || in[f.Name] != 1 {
			t.Errorf("--%s: in %d groups (annotation %q), want exactly one: add it to serveFlagGroups", f.Name, in[f.Name], got)
		}
	})
	if n < 50 {
		t.Errorf("serve has %d flags: fewer than expected", n)
	}

	code, out, _ := runCapture(t, "serve", "--help")
	if code != 0 {
		t.Fatalf("serve --help: exit %d", code)
	}
	usage := out[strings.Index(out, "Usage:"):]
	for _, g := range serveFlagGroups {
		if !strings.Contains(usage, "\n"+g.title+":\n") {
			t.Errorf("serve --help lacks the heading %q", g.title)
		}
	}
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if c := len(regexp.MustCompile(`(?m)^ +(-\w, )?--`+regexp.QuoteMeta(f.Name)+` `).FindAllString(usage, -1)); c != 1 {
			t.Errorf("serve --help lists --%s %d times, want once", f.Name, c)
		}
	})
	// Under its heading: --raft-listen in the cluster's group.
	cl := usage[strings.Index(usage, "\nCluster (Raft):\n"):]
	cl = cl[:strings.Index(cl[1:], "\n\n")+1]
	if !strings.Contains(cl, "--raft-listen") || strings.Contains(cl, "--peer-listen") {
		t.Errorf("the cluster group:\n%s", cl)
	}
}
