package main

import (
	"strings"
	"testing"
)

// TestQuietWriterDropsStorageVersionLine: the members' error lines reach
// stderr, but for etcd's harmless start-up line about the storage schema
// version; after quiet is set, nothing does.
func TestQuietWriterDropsStorageVersionLine(t *testing.T) {
	var b strings.Builder
	q := &quietWriter{w: &b}
	harmless := `{"level":"error","caller":"version/monitor.go:120","msg":"failed to update storage version","cluster-version":"3.7.0","error":"cannot detect storage schema version: missing term information"}` + "\n"
	real := `{"level":"error","msg":"failed to update storage version","error":"disk full"}` + "\n"
	for _, line := range []string{harmless, real} {
		if n, err := q.Write([]byte(line)); n != len(line) || err != nil {
			t.Fatalf("Write: %d, %v", n, err)
		}
	}
	if b.String() != real {
		t.Errorf("passed on %q, want only %q", b.String(), real)
	}
	q.quiet.Store(true)
	q.Write([]byte(real))
	if b.String() != real {
		t.Errorf("quiet: passed on %q", b.String())
	}
}
