package benchkit

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestHistQuantiles(t *testing.T) {
	var h Hist
	rng := rand.New(rand.NewPCG(1, 2))
	samples := make([]time.Duration, 100_000)
	for i := range samples {
		// Log-uniform between 1 µs and 100 ms.
		samples[i] = time.Duration(1000 * float64(uint64(1)<<uint(rng.IntN(17))) * (1 + rng.Float64()))
		h.Record(samples[i])
	}
	slices.Sort(samples)
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		exact := samples[int(q*float64(len(samples)))-1]
		got := h.Quantile(q)
		if d := float64(got-exact) / float64(exact); d > 0.02 || d < -0.02 {
			t.Errorf("q%.3f: got %v, exact %v (%.1f%% off)", q, got, exact, 100*d)
		}
	}
	if h.Quantile(1) != samples[len(samples)-1] || h.Quantile(0) < samples[0] {
		t.Errorf("extremes: %v %v vs %v %v", h.Quantile(0), h.Quantile(1), samples[0], samples[len(samples)-1])
	}
	for _, v := range []uint64{0, 1, 127, 128, 129, 1 << 20, 1<<63 + 12345, ^uint64(0)} {
		i := histIndex(v)
		if i < 0 || i >= histBuckets {
			t.Fatalf("index %d for %d out of range", i, v)
		}
		if mid := histValue(i); v >= histSub && (float64(mid) < float64(v)*0.98 || float64(mid) > float64(v)*1.02) {
			t.Errorf("bucket of %d has middle %d", v, mid)
		}
	}
}

func TestHistMergeAndSummary(t *testing.T) {
	var a, b, empty Hist
	for i := 1; i <= 100; i++ {
		a.Record(time.Duration(i) * time.Microsecond)
		b.Record(time.Duration(100+i) * time.Microsecond)
	}
	a.Merge(&b)
	a.Merge(&empty)
	s := a.Summary()
	if s.Count != 200 || s.MaxUS != 200 || s.P50US < 98 || s.P50US > 102 || s.MeanUS < 99 || s.MeanUS > 102 {
		t.Errorf("summary of 1..200 µs: %+v", s)
	}
	if z := empty.Summary(); z != (LatencySummary{}) {
		t.Errorf("empty summary: %+v", z)
	}
}

var sink int

func TestStartHostLoad(t *testing.T) {
	if _, err := os.Stat("/proc/self/task"); err != nil {
		t.Skipf("no /proc: %v", err)
	}
	end := StartHostLoad()
	for x := 0; x < 1e7; x++ {
		sink += x * x
	}
	if h := end(); h.CPUSeconds <= 0 || h.RunqWaitSeconds < 0 {
		t.Errorf("host load after a busy loop: %+v", h)
	}
}

// memLock is a CycleClient of an in-memory lock table: a contended key is
// waited for (polled), and every failAt-th Acquire fails with errSkip.
type memLock struct {
	mu     *sync.Mutex
	held   map[string]bool
	key    string
	n      int
	failAt int
}

var errSkip = errors.New("not obtained")

func (c *memLock) Acquire(key string) error {
	c.n++
	if c.failAt > 0 && c.n%c.failAt == 0 {
		return errSkip
	}
	for {
		c.mu.Lock()
		if !c.held[key] {
			c.held[key], c.key = true, key
			c.mu.Unlock()
			return nil
		}
		c.mu.Unlock()
		time.Sleep(10 * time.Microsecond)
	}
}

func (c *memLock) Release() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.held[c.key] {
		return errors.New("not held")
	}
	delete(c.held, c.key)
	return nil
}

func TestRunCycles(t *testing.T) {
	var mu sync.Mutex
	held := map[string]bool{}
	clients := func(failAt int) []CycleClient {
		cs := make([]CycleClient, 4)
		for i := range cs {
			cs[i] = &memLock{mu: &mu, held: held, failAt: failAt}
		}
		return cs
	}
	w := Cycles{Warmup: 20 * time.Millisecond, Duration: 50 * time.Millisecond, Key: func(i int) string { return fmt.Sprint("k", i) },
		Skip: func(err error) bool { return errors.Is(err, errSkip) }}
	r, err := RunCycles(t.Context(), w, clients(3))
	if err != nil {
		t.Fatal(err)
	}
	if r.Cycles == 0 || r.All <= r.Cycles || r.Skipped == 0 || r.Acquire.Count != r.Cycles || r.Cycle.Count != r.Cycles ||
		r.Handoff != nil || r.Seconds < 0.049 || r.Seconds > 0.051 || r.CyclesPerSec != float64(r.Cycles)/r.Seconds {
		t.Errorf("uncontended: %+v", r)
	}

	w.Contended, w.Skip = true, nil
	w.Key = func(int) string { return "hot" }
	if r, err = RunCycles(t.Context(), w, clients(0)); err != nil {
		t.Fatal(err)
	}
	if r.Cycles == 0 || r.Handoff == nil || r.Handoff.Count == 0 || r.Skipped != 0 {
		t.Errorf("contended: %+v", r)
	}

	// An error Skip does not count ends the run, naming the key.
	if _, err = RunCycles(t.Context(), w, clients(2)); !errors.Is(err, errSkip) || !strings.Contains(err.Error(), "acquire of hot") {
		t.Errorf("error: %v", err)
	}
	if len(held) != 0 {
		t.Errorf("left held: %v", held)
	}
}

func TestWriteLine(t *testing.T) {
	var b strings.Builder
	var none *LatencySummary
	none.WriteLine(&b, "x")
	(&LatencySummary{}).WriteLine(&b, "x")
	(*HostLoad)(nil).WriteLine(&b)
	if b.Len() != 0 {
		t.Fatalf("nil and empty: %q", b.String())
	}
	(&LatencySummary{Count: 3, P50US: 1.25, P99US: 9}).WriteLine(&b, "acquire")
	(&HostLoad{CPUSeconds: 1.5}).WriteLine(&b)
	want := "  acquire          p50      1.2 µs  p90      0.0 µs  p99      9.0 µs  p99.9      0.0 µs  max       0.0 µs  (n=3)\n" +
		"  host: this process used 1.5 CPU-s and its threads waited 0.0 s for a CPU (load average 0.0)\n"
	if b.String() != want {
		t.Errorf("got\n%q\nwant\n%q", b.String(), want)
	}
}

func TestReport(t *testing.T) {
	type res struct {
		Cycles int `json:"cycles"`
	}
	human := func(w io.Writer, r res) { fmt.Fprintf(w, "%d cycles\n", r.Cycles) }
	var b strings.Builder
	if err := Report(&b, false, res{3}, human); err != nil || b.String() != "3 cycles\n" {
		t.Errorf("text: %q, %v", b.String(), err)
	}
	b.Reset()
	if err := Report(&b, true, res{3}, human); err != nil || b.String() != "{\n  \"cycles\": 3\n}\n" {
		t.Errorf("JSON: %q, %v", b.String(), err)
	}
}
