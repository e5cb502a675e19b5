//go:build unix

package server

import "syscall"

// OpenFileLimit returns the process's soft limit on open files (which the Go
// runtime has already raised to the hard limit at startup).
func OpenFileLimit() (uint64, bool) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, false
	}
	return uint64(lim.Cur), true
}
