package proctest

import (
	"errors"
	"os"
	"path/filepath"
)

// ModuleRoot returns the directory holding the module's go.mod, found by
// walking up from the working directory (a test's working directory is its
// package directory).
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
