package logstore

// Benchmarks comparing raft-boltdb v2, opened as internal/raftstore.Open
// opens it, with raft-wal v0.4.1 (defaults, 64 MiB segments). The commands
// are in the package doc. BenchmarkOpen1M and BenchmarkCompact fill their
// stores with large batches (4096 entries per StoreLogs) to keep the setup
// short.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/raft"
)

// BenchmarkStoreLogs: one op is one StoreLogs call of batch entries, as the
// leader's (or a follower's) append of a batch of commands.
func BenchmarkStoreLogs(b *testing.B) {
	for _, batch := range []int{1, 16, 64, 256} {
		for _, k := range kinds {
			b.Run(fmt.Sprintf("batch=%d/%s", batch, k.name), func(b *testing.B) {
				s, closeFn := openKind(b, k, b.TempDir())
				defer closeFn()
				next := uint64(1)
				b.ResetTimer()
				for b.Loop() {
					if err := s.StoreLogs(makeLogs(next, batch)); err != nil {
						b.Fatal(err)
					}
					next += uint64(batch)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(next-1), "ns/entry")
			})
		}
	}
}

// BenchmarkGetLog reads entries among the last 1000 of a 100k-entry log,
// as replication to a follower that is a little behind does.
func BenchmarkGetLog(b *testing.B) {
	const n = 100_000
	for _, k := range kinds {
		b.Run(k.name, func(b *testing.B) {
			s, closeFn := openKind(b, k, b.TempDir())
			defer closeFn()
			fill(b, s, 1, n, 4096)
			var l raft.Log
			i := uint64(0)
			b.ResetTimer()
			for b.Loop() {
				if err := s.GetLog(n-i%1000, &l); err != nil {
					b.Fatal(err)
				}
				i += 7
			}
		})
	}
}

// BenchmarkDeleteRange is the steady-state compaction after a snapshot: one
// op appends 8192 entries (untimed, raft's SnapshotThreshold) and deletes the
// head of the log down to trailingLogs entries (timed).
func BenchmarkDeleteRange(b *testing.B) {
	const perSnapshot = 8192
	for _, k := range kinds {
		b.Run(k.name, func(b *testing.B) {
			s, closeFn := openKind(b, k, b.TempDir())
			defer closeFn()
			fill(b, s, 1, trailingLogs, 4096)
			first, next := uint64(1), uint64(trailingLogs+1)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				fill(b, s, next, perSnapshot, 256)
				next += perSnapshot
				b.StartTimer()
				last := next - 1 - trailingLogs
				if err := s.DeleteRange(first, last); err != nil {
					b.Fatal(err)
				}
				first = last + 1
			}
			b.StopTimer()
			if got, err := s.FirstIndex(); err != nil || got != first {
				b.Fatalf("FirstIndex = %d, %v; want %d", got, err, first)
			}
		})
	}
}

// BenchmarkCompact: one op fills a new store with 1M entries (untimed), then
// deletes all but the trailingLogs last (timed). It reports the disk space
// before and after.
func BenchmarkCompact(b *testing.B) {
	const n = 1_000_000
	for _, k := range kinds {
		b.Run(k.name, func(b *testing.B) {
			var before, after float64
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				dir := b.TempDir()
				s, closeFn := openKind(b, k, dir)
				fill(b, s, 1, n, 4096)
				before += diskUsage(b, dir)
				b.StartTimer()
				if err := s.DeleteRange(1, n-trailingLogs); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				after += diskUsage(b, dir)
				closeFn()
			}
			b.ReportMetric(before/float64(b.N), "MiB-1M")
			b.ReportMetric(after/float64(b.N), "MiB-compacted")
		})
	}
}

var (
	filled   = map[string]string{} // store kind -> dir holding 1M entries
	filledMu sync.Mutex
	benchDir string // removed by TestMain
)

// filled1M returns a directory with a closed store of kind k holding 1M
// entries, filled once per process.
func filled1M(b *testing.B, k storeKind) string {
	filledMu.Lock()
	defer filledMu.Unlock()
	if dir, ok := filled[k.name]; ok {
		return dir
	}
	if benchDir == "" {
		d, err := os.MkdirTemp("", "logstore-bench")
		if err != nil {
			b.Fatal(err)
		}
		benchDir = d
	}
	dir := filepath.Join(benchDir, k.name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	s, closeFn := openKind(b, k, dir)
	fill(b, s, 1, 1_000_000, 4096)
	closeFn()
	filled[k.name] = dir
	return dir
}

// BenchmarkOpen1M: one op opens a store of 1M entries, reads its last entry
// and closes it (a node's restart, before the snapshot restore).
func BenchmarkOpen1M(b *testing.B) {
	for _, k := range kinds {
		b.Run(k.name, func(b *testing.B) {
			b.StopTimer()
			dir := filled1M(b, k)
			b.StartTimer()
			for i := 0; i < b.N; i++ {
				s, closeFn := openKind(b, k, dir)
				last, err := s.LastIndex()
				if err != nil || last != 1_000_000 {
					b.Fatalf("LastIndex = %d, %v", last, err)
				}
				var l raft.Log
				if err := s.GetLog(last, &l); err != nil {
					b.Fatal(err)
				}
				closeFn()
			}
		})
	}
}

// fsyncProbeEnv, set to "KIND:DIR", makes the test binary a probe that
// opens a store of that kind in DIR and makes 5 StoreLogs calls of 16
// entries, each followed by a "stored N" line on stdout. Run under strace to
// see the fsyncs each call makes:
//
//	LOGSTORE_FSYNC_PROBE=wal:/var/tmp/p strace -f -e trace=fsync,fdatasync,write /tmp/logstore.test
const fsyncProbeEnv = "LOGSTORE_FSYNC_PROBE"

func fsyncProbe(spec string) int {
	name, dir, _ := strings.Cut(spec, ":")
	k, ok := kindByName(name)
	if !ok {
		fmt.Println("unknown store kind", name)
		return 1
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		fmt.Println(err)
		return 1
	}
	s, err := k.open(dir)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	last, _ := s.log.LastIndex()
	os.Stdout.WriteString("opened\n")
	for i := range 5 {
		if err := s.log.StoreLogs(makeLogs(last+1+uint64(16*i), 16)); err != nil {
			fmt.Println(err)
			return 1
		}
		os.Stdout.WriteString(fmt.Sprintf("stored %d\n", i))
	}
	if err := s.close(); err != nil {
		fmt.Println(err)
		return 1
	}
	return 0
}
