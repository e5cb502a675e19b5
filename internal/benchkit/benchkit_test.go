package benchkit

import (
	"math/rand/v2"
	"os"
	"slices"
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
