//go:build !linux

package raftlog

import "os"

// preallocate does nothing here: records are appended at the file's end.
func preallocate(*os.File, int64) error { return nil }

// datasync is f.Sync here.
func datasync(f *os.File) error { return f.Sync() }

// noSpace is never asked here: preallocate does not fail.
func noSpace(error) bool { return false }

// nextData reports all of [off, end) as data here.
func nextData(_ *os.File, off, end int64) (int64, int64, error) { return off, end, nil }
