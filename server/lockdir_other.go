//go:build !unix

package server

import (
	"fmt"
	"os"
)

// lockDir opens path; there is no advisory lock on this platform.
func lockDir(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("server: data dir lock %s: %w", path, err)
	}
	return f, nil
}

func unlockDir(f *os.File) {
	if f != nil {
		f.Close()
	}
}
