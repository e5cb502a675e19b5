package main

import (
	"math"
	"math/bits"
	"time"
)

// hist is a log-linear histogram of durations in nanoseconds, like HDR
// Histogram with 7 significant bits: every value is kept within 1/64 (1.6%)
// of its true value, in constant memory (about 30 KiB), with O(1) Record.
// It is not safe for concurrent use: each client has its own and they are
// merged at the end.
type hist struct {
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

func (h *hist) record(d time.Duration) {
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

func (h *hist) merge(o *hist) {
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

// quantile returns the value at quantile q (0..1), clamped to [min, max].
func (h *hist) quantile(q float64) time.Duration {
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

func (h *hist) mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// latencySummary is the JSON/human form of a histogram.
type latencySummary struct {
	Count  uint64  `json:"count"`
	MeanUS float64 `json:"mean_us"`
	P50US  float64 `json:"p50_us"`
	P90US  float64 `json:"p90_us"`
	P99US  float64 `json:"p99_us"`
	P999US float64 `json:"p999_us"`
	MaxUS  float64 `json:"max_us"`
}

func us(d time.Duration) float64 { return math.Round(float64(d)/10) / 100 }

func (h *hist) summary() latencySummary {
	return latencySummary{
		Count:  h.n,
		MeanUS: us(h.mean()),
		P50US:  us(h.quantile(0.50)),
		P90US:  us(h.quantile(0.90)),
		P99US:  us(h.quantile(0.99)),
		P999US: us(h.quantile(0.999)),
		MaxUS:  us(time.Duration(h.max)),
	}
}
