package raftlog

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// TestOpenDamageAcrossLastTwoBatches: a block zeroed across the end of
// the last batch but one and the start of the last batch destroys both
// the end mark of the one and the start mark of the other, so no later
// batch start is left to see; the rest of the last batch still follows.
// The entries of the last batch but one were acknowledged (fdatasync'ed
// before the last batch was written): Open must refuse, naming the file
// and the first bad record, and change nothing; only damage shown to lie
// in the last batch is cut.
func TestOpenDamageAcrossLastTwoBatches(t *testing.T) {
	tests := []struct {
		name    string
		batches [][2]uint64
		index   uint64 // the first damaged record
		damage  func(t *testing.T, path string, offs []int64)
	}{
		{"zeros from the middle of 8 to the middle of 9, a last batch of one", [][2]uint64{{1, 4}, {5, 8}, {9, 9}}, 8,
			func(t *testing.T, path string, offs []int64) {
				from, to := offs[7]+recHeaderSize+30, offs[8]+recHeaderSize+20
				writeAt(t, path, from, make([]byte, to-from))
			}},
		{"zeros from the middle of 8 to the middle of 9, 10-12 intact", [][2]uint64{{1, 4}, {5, 8}, {9, 12}}, 8,
			func(t *testing.T, path string, offs []int64) {
				from, to := offs[7]+recHeaderSize+30, offs[8]+recHeaderSize+20
				writeAt(t, path, from, make([]byte, to-from))
			}},
		{"zeros from 8's length to the middle of 9", [][2]uint64{{1, 4}, {5, 8}, {9, 12}}, 8,
			func(t *testing.T, path string, offs []int64) {
				writeAt(t, path, offs[7], make([]byte, offs[8]+recHeaderSize+20-offs[7]))
			}},
		{"8's length and 9's header zeroed", [][2]uint64{{1, 4}, {5, 8}, {9, 12}}, 8,
			func(t *testing.T, path string, offs []int64) {
				writeAt(t, path, offs[7], make([]byte, 4))
				writeAt(t, path, offs[8], make([]byte, recHeaderSize+20))
			}},
		{"zeros from the middle of 7 to the middle of 9", [][2]uint64{{1, 4}, {5, 8}, {9, 12}}, 7,
			func(t *testing.T, path string, offs []int64) {
				from, to := offs[6]+recHeaderSize+30, offs[8]+recHeaderSize+20
				writeAt(t, path, from, make([]byte, to-from))
			}},
		{"garbage over 5 and 6, 7-10 intact", [][2]uint64{{1, 4}, {5, 10}}, 5,
			// 6 may have started a batch: nothing says 5 is in the last one.
			func(t *testing.T, path string, offs []int64) {
				writeAt(t, path, offs[4], bytes.Repeat([]byte{0xa5}, int(offs[6]-offs[4])))
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path, offs := storeBatches(t, dir, tt.batches...)
			tt.damage(t, path, offs)
			before := readFile(t, path)
			s, logs, err := openLogged(dir)
			if err == nil {
				last, _ := s.LastIndex()
				s.Close()
				t.Fatalf("Open succeeded with entries up to %d; log: %s", last, logs)
			}
			for _, want := range []string{path, fmt.Sprintf("corrupt record at offset %d (index %d)", offs[tt.index-1], tt.index), "acknowledged batch", "not a torn write"} {
				if !strings.Contains(err.Error(), want) {
					t.Fatalf("Open = %v; want an error with %q", err, want)
				}
			}
			if !bytes.Equal(readFile(t, path), before) {
				t.Fatalf("Open changed %s", path)
			}
		})
	}
}
