package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
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
	clock := uint64(start.UnixMicro())
	res, err := run(t.Context(), &out, stall)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the story took %v, want under 10 s", took)
	}

	// A fresh token store starts above the wall clock in µs at its
	// creation: A gets the first token, B the next.
	if res.TokenA <= clock || res.TokenB != res.TokenA+1 {
		t.Errorf("tokens A=%d B=%d, want A above the clock at the start (%d) and B=A+1", res.TokenA, res.TokenB, clock)
	}
	if res.Stale == nil || res.Stale.Token != res.TokenA || res.Stale.HighWater != res.TokenB || res.Stale.Resource != key {
		t.Errorf("stale error %+v, want token %d, high-water %d, resource %q", res.Stale, res.TokenA, res.TokenB, key)
	}
	want := order{ID: 42, Status: "shipped", ShippedBy: "B", Token: res.TokenB}
	if res.Order != want {
		t.Errorf("final row %v, want %v", res.Order, want)
	}

	// Timings and the two tokens (which depend on the clock) masked.
	got := regexp.MustCompile(`(?m)^\[ *\d+\.\ds\]`).ReplaceAll(out.Bytes(), []byte("[t]"))
	got = bytes.ReplaceAll(got, []byte(strconv.FormatUint(res.TokenA, 10)), []byte("<A>"))
	got = bytes.ReplaceAll(got, []byte(strconv.FormatUint(res.TokenB, 10)), []byte("<B>"))
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
