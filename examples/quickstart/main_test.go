package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ticketing-dev/ticketing/fence"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var update = flag.Bool("update", false, "rewrite testdata/story.golden")

// TestStory runs the whole story and checks its outcome, and the shape of
// the narrative (timings masked) against testdata/story.golden.
func TestStory(t *testing.T) {
	var out bytes.Buffer
	start := time.Now()
	res, err := run(t.Context(), &out, stall)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the story took %v, want under 10 s", took)
	}

	// A fresh token store starts at 1: A gets 1, B 2.
	if res.TokenA != 1 || res.TokenB != 2 {
		t.Errorf("tokens A=%d B=%d, want 1 and 2", res.TokenA, res.TokenB)
	}
	if res.Stale == nil || res.Stale.Token != 1 || res.Stale.HighWater != 2 || res.Stale.Resource != key {
		t.Errorf("stale error %+v, want token 1, high-water 2, resource %q", res.Stale, key)
	}
	want := order{ID: 42, Status: "shipped", ShippedBy: "B", Token: 2}
	if res.Order != want {
		t.Errorf("final row %v, want %v", res.Order, want)
	}

	got := regexp.MustCompile(`(?m)^\[ *\d+\.\ds\]`).ReplaceAll(out.Bytes(), []byte("[t]"))
	golden := filepath.Join("testdata", "story.golden")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	wantOut, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, wantOut) {
		t.Errorf("narrative differs from %s (run with -update to accept):\n--- got\n%s--- want\n%s", golden, got, wantOut)
	}
}

// TestCheck: run reports a story that did not end as told, rather than
// printing a success.
func TestCheck(t *testing.T) {
	good := outcome{
		TokenA: 1, TokenB: 2,
		Stale: &fence.StaleError{Resource: key, Token: 1, HighWater: 2},
		Order: order{ID: 42, Status: "shipped", ShippedBy: "B", Token: 2},
	}
	if err := good.check(); err != nil {
		t.Fatalf("good outcome: %v", err)
	}
	for name, mutate := range map[string]func(*outcome){
		"A not rejected":    func(o *outcome) { o.Stale = nil },
		"A's row":           func(o *outcome) { o.Order.ShippedBy, o.Order.Token = "A", 1 },
		"tokens not rising": func(o *outcome) { o.TokenB = 1 },
		"wrong high-water":  func(o *outcome) { o.Stale = &fence.StaleError{Resource: key, Token: 1, HighWater: 7} },
		"row not shipped":   func(o *outcome) { o.Order.Status = "paid" },
	} {
		t.Run(name, func(t *testing.T) {
			o := good
			mutate(&o)
			if err := o.check(); err == nil {
				t.Errorf("check accepted %+v", o)
			}
		})
	}
}
