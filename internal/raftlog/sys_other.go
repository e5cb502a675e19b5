//go:build !linux

package raftlog

import "os"

// preallocate does nothing here: records are appended at the file's end.
func preallocate(*os.File, int64) error { return nil }

// datasync is f.Sync here.
func datasync(f *os.File) error { return f.Sync() }
