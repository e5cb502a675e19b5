package logstore

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain is also the child processes of TestCrashKill9 and the fsync
// probe: they run the test binary itself.
func TestMain(m *testing.M) {
	if spec := os.Getenv(crashChildEnv); spec != "" {
		os.Exit(crashChild(spec))
	}
	if spec := os.Getenv(fsyncProbeEnv); spec != "" {
		os.Exit(fsyncProbe(spec))
	}
	code := m.Run()
	if benchDir != "" {
		os.RemoveAll(benchDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}
