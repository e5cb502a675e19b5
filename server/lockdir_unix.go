//go:build unix

package server

import (
	"fmt"
	"os"
	"syscall"
)

// lockDir takes an exclusive advisory lock on path, so that two servers never
// share one token store.
func lockDir(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("server: data dir lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("server: data dir lock %s: another server uses this data dir (%w)", path, err)
	}
	return f, nil
}

func unlockDir(f *os.File) {
	if f != nil {
		f.Close() // closing the descriptor releases the flock
	}
}
