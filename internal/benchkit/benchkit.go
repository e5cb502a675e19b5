// Package benchkit has what the project's load tools share, so that
// ticketing-bench, bench/etcd's etcd-bench and bench/peers's peers-bench
// measure alike: a latency histogram and its summary, a reading of the
// host's load, their lines of human output, and the acquire+release loop
// of the tools that drive a client library (RunCycles).
package benchkit

import (
	"math"
	"math/bits"
	"os"
	"strconv"
	"strings"
	"time"
)

// Hist is a log-linear histogram of durations in nanoseconds, like HDR
// Histogram with 7 significant bits: every value is kept within 1/64 (1.6%)
// of its true value, in constant memory (about 30 KiB), with O(1) Record.
// It is not safe for concurrent use: each client has its own and they are
// merged at the end.
type Hist struct {
	counts   [histBuckets]uint64
	n        uint64
	sum      float64
	min, max uint64
}

const (
	histSubBits = 7
	histSub     = 1 << histSubBits                     // 128
	histHalf    = histSub / 2                          // 64 sub-buckets per octave
	histBuckets = (65-histSubBits)*histHalf + histHalf // covers every uint64
)

func histIndex(v uint64) int {
	if v < histSub {
		return int(v)
	}
	s := bits.Len64(v) - histSubBits // >= 1
	top := v >> uint(s)              // in [64, 128)
	return s*histHalf + int(top)
}

// histValue returns the middle of bucket i.
func histValue(i int) uint64 {
	if i < histSub {
		return uint64(i)
	}
	s := i/histHalf - 1
	top := uint64(i - s*histHalf)
	lo := top << uint(s)
	return lo + (uint64(1)<<uint(s))/2
}

// Record adds one duration (a negative one counts as 0).
func (h *Hist) Record(d time.Duration) {
	v := uint64(0)
	if d > 0 {
		v = uint64(d)
	}
	h.counts[histIndex(v)]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.n++
	h.sum += float64(v)
}

// Merge adds o's samples to h.
func (h *Hist) Merge(o *Hist) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.n += o.n
	h.sum += o.sum
}

// Quantile returns the value at quantile q (0..1), clamped to [min, max].
func (h *Hist) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	if rank <= 1 {
		return time.Duration(h.min)
	}
	if rank >= h.n {
		return time.Duration(h.max)
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			v := histValue(i)
			v = max(v, h.min)
			v = min(v, h.max)
			return time.Duration(v)
		}
	}
	return time.Duration(h.max)
}

// Mean is the mean duration, 0 without samples.
func (h *Hist) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// LatencySummary is the JSON/human form of a histogram.
type LatencySummary struct {
	Count  uint64  `json:"count"`
	MeanUS float64 `json:"mean_us"`
	P50US  float64 `json:"p50_us"`
	P90US  float64 `json:"p90_us"`
	P99US  float64 `json:"p99_us"`
	P999US float64 `json:"p999_us"`
	MaxUS  float64 `json:"max_us"`
}

func us(d time.Duration) float64 { return math.Round(float64(d)/10) / 100 }

// Summary rounds the count, mean, p50, p90, p99, p99.9 and max to
// hundredths of a microsecond.
func (h *Hist) Summary() LatencySummary {
	return LatencySummary{
		Count:  h.n,
		MeanUS: us(h.Mean()),
		P50US:  us(h.Quantile(0.50)),
		P90US:  us(h.Quantile(0.90)),
		P99US:  us(h.Quantile(0.99)),
		P999US: us(h.Quantile(0.999)),
		MaxUS:  us(time.Duration(h.max)),
	}
}

// HostLoad is what else was going on during a run: this process's CPU
// time, the time its threads were runnable but waiting for a CPU (from
// /proc/self/task/*/schedstat: the host was busy with other processes),
// and the load average. Zero where /proc cannot be read.
type HostLoad struct {
	CPUSeconds      float64 `json:"process_cpu_seconds"`
	RunqWaitSeconds float64 `json:"runqueue_wait_seconds"`
	LoadAvg1        float64 `json:"loadavg_1m"`
}

// StartHostLoad starts a reading; the function it returns ends it.
func StartHostLoad() func() *HostLoad {
	cpu0, wait0 := schedstat()
	return func() *HostLoad {
		cpu1, wait1 := schedstat()
		return &HostLoad{CPUSeconds: (cpu1 - cpu0).Seconds(), RunqWaitSeconds: (wait1 - wait0).Seconds(), LoadAvg1: loadAvg()}
	}
}

func schedstat() (cpu, wait time.Duration) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0, 0
	}
	for _, e := range ents {
		b, err := os.ReadFile("/proc/self/task/" + e.Name() + "/schedstat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) >= 2 {
			c, _ := strconv.ParseInt(f[0], 10, 64)
			w, _ := strconv.ParseInt(f[1], 10, 64)
			cpu += time.Duration(c)
			wait += time.Duration(w)
		}
	}
	return cpu, wait
}

func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}
