//go:build !unix

package server

func OpenFileLimit() (uint64, bool) { return 0, false }
