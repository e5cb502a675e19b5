// Package fsutil has the file system steps that the durable stores share.
package fsutil

import "os"

// SyncDir fsyncs the directory dir, so that the names created, renamed or
// removed in it survive a crash.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
