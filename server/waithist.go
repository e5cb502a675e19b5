package server

import (
	"math"

	dto "github.com/prometheus/client_model/go"
)

// WaitHistogram is the grant-wait histogram (Stats.GrantWait): how long
// granted ACQUIREs waited from being read to being granted, the same
// observations as the ticketing_grant_wait_seconds metric. Its counts are
// cumulative since the server started: the difference of two snapshots
// (Sub) is the histogram of the grants between them.
type WaitHistogram struct {
	// Bounds are the buckets' upper bounds in seconds, increasing; the
	// same for every snapshot of every server (do not modify).
	Bounds []float64 `json:"bounds_s"`
	// Counts has len(Bounds)+1 entries: Counts[i] grants waited at most
	// Bounds[i] and more than Bounds[i-1]; the last entry counts those
	// above the last bound. Not cumulative over the buckets.
	Counts []uint64 `json:"counts"`
	// Count is the number of grants observed (the sum of Counts).
	Count uint64 `json:"count"`
	// SumS is the sum of their waits, in seconds.
	SumS float64 `json:"sum_s"`
}

// Sub returns the histogram of the observations made between old and h,
// two snapshots of the same server with old the earlier one. A bucket
// whose count went down (a server restart between them) counts 0.
func (h WaitHistogram) Sub(old WaitHistogram) WaitHistogram {
	d := WaitHistogram{Bounds: h.Bounds, Counts: make([]uint64, len(h.Counts))}
	for i, c := range h.Counts {
		if i < len(old.Counts) && old.Counts[i] <= c {
			c -= old.Counts[i]
		}
		d.Counts[i] = c
		d.Count += c
	}
	if h.SumS > old.SumS && d.Count > 0 {
		d.SumS = h.SumS - old.SumS
	}
	return d
}

// Quantile estimates the q-quantile (0 <= q <= 1) of the waits, in
// seconds, as Prometheus's histogram_quantile does: linear interpolation
// within the bucket that holds it, from 0 for the first bucket. A
// quantile in the bucket above the last bound is reported as the last
// bound. ok is false when the histogram is empty or q is out of range.
func (h WaitHistogram) Quantile(q float64) (seconds float64, ok bool) {
	if h.Count == 0 || q < 0 || q > 1 || math.IsNaN(q) || len(h.Counts) != len(h.Bounds)+1 {
		return 0, false
	}
	rank := q * float64(h.Count)
	var below uint64
	for i, c := range h.Counts {
		if c == 0 || float64(below+c) < rank {
			below += c
			continue
		}
		if i == len(h.Bounds) {
			return h.Bounds[len(h.Bounds)-1], true
		}
		lo := 0.0
		if i > 0 {
			lo = h.Bounds[i-1]
		}
		return lo + (h.Bounds[i]-lo)*(rank-float64(below))/float64(c), true
	}
	return h.Bounds[len(h.Bounds)-1], true
}

// grantWait reads the grant-wait histogram.
func (m *counters) grantWait() WaitHistogram {
	h := WaitHistogram{Bounds: waitBounds[:], Counts: make([]uint64, len(waitBounds)+1)}
	var pb dto.Metric
	if err := m.wait.Write(&pb); err != nil || pb.Histogram == nil {
		return h
	}
	var prev uint64
	for i, b := range pb.Histogram.GetBucket() {
		if i >= len(waitBounds) {
			break
		}
		c := b.GetCumulativeCount()
		h.Counts[i] = c - min(prev, c)
		prev = c
	}
	h.Count = pb.Histogram.GetSampleCount()
	h.Counts[len(waitBounds)] = h.Count - min(prev, h.Count)
	h.SumS = pb.Histogram.GetSampleSum()
	return h
}
