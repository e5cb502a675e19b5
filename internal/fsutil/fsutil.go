// Package fsutil has the file system steps that the durable stores share.
package fsutil

import (
	"os"
	"path/filepath"
)

// WriteFileSync writes data to a new file at path (mode 0600, replacing
// one that is there) and fsyncs it before it returns: the first step of a
// durable replacement (then a rename over the old file and SyncDir).
func WriteFileSync(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

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

// ReplaceFile durably replaces the file at path with data: WriteFileSync
// of path+".tmp", a rename over path, and SyncDir of path's directory.
// After a crash the file is either the old one or the new one, whole.
func ReplaceFile(path string, data []byte) error {
	if err := WriteFileSync(path+".tmp", data); err != nil {
		return err
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}
