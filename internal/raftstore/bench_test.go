package raftstore

// Benchmarks comparing raft-boltdb v2 (the store Open uses) with raft-wal
// v0.4.1, both with their defaults: every StoreLogs is fsync'd before it
// returns (strace: bolt makes two fdatasyncs per call, raft-wal one fsync;
// see fsyncProbeEnv). Use a disk, not tmpfs (os.TempDir must not be a
// tmpfs; else set TMPDIR). The figures in the package doc come from three
// rounds, each running both stores in turn:
//
//	go test -c -o /tmp/raftstore.test ./internal/raftstore
//	for i in 1 2 3; do
//	  /tmp/raftstore.test -test.run '^$' -test.bench 'StoreLogs|DeleteRange' -test.benchtime 200x
//	  /tmp/raftstore.test -test.run '^$' -test.bench GetLog -test.benchtime 0.5s
//	  /tmp/raftstore.test -test.run '^$' -test.bench Compact -test.benchtime 1x
//	  /tmp/raftstore.test -test.run '^$' -test.bench Open1M -test.benchtime 5x
//	done
//
// BenchmarkOpen1M and BenchmarkCompact fill their stores with large batches
// (4096 entries per StoreLogs) to keep the setup short.

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
)

// payloadSize is the size of a log entry's data, about a grant command.
const payloadSize = 64

// trailingLogs is raft's default Config.TrailingLogs: what a compaction
// after a snapshot keeps.
const trailingLogs = 10240

type storeKind struct {
	name string
	open func(dir string) (raft.LogStore, func() error, error)
}

var kinds = []storeKind{
	{"bolt", func(dir string) (raft.LogStore, func() error, error) {
		db, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db")})
		if err != nil {
			return nil, nil, err
		}
		return db, db.Close, nil
	}},
	{"wal", func(dir string) (raft.LogStore, func() error, error) {
		w, closeFn, err := openWAL(dir, 0)
		return w, closeFn, err
	}},
}

// openWAL opens a raft-wal log in dir with segments of segmentSize bytes
// (0: the default, 64 MiB). The returned func closes the log and its
// metadata file: wal.WAL.Close leaves the metadata (bbolt) file open and
// locked, so a reopen in the same process would block forever.
func openWAL(dir string, segmentSize int) (*wal.WAL, func() error, error) {
	meta := &metadb.BoltMetaDB{}
	w, err := wal.Open(dir, wal.WithMetaStore(meta), wal.WithLogger(hclog.NewNullLogger()), wal.WithSegmentSize(segmentSize))
	if err != nil {
		meta.Close()
		return nil, nil, err
	}
	return w, func() error {
		err := w.Close()
		if merr := meta.Close(); err == nil {
			err = merr
		}
		return err
	}, nil
}

// makeLogs returns n entries from index first, as raft's leader builds them.
func makeLogs(first uint64, n int) []*raft.Log {
	logs := make([]*raft.Log, n)
	now := time.Now()
	for i := range logs {
		idx := first + uint64(i)
		logs[i] = &raft.Log{Index: idx, Term: 1, Type: raft.LogCommand, Data: payload(idx), AppendedAt: now}
	}
	return logs
}

// payload is the data of entry idx: payloadSize bytes that depend on idx, so
// a reader can check it.
func payload(idx uint64) []byte {
	p := make([]byte, payloadSize)
	for i := range p {
		p[i] = byte(idx>>(8*(i%8))) ^ byte(i)
	}
	return p
}

// fill appends entries first..first+n-1 in batches of batch.
func fill(tb testing.TB, s raft.LogStore, first uint64, n, batch int) {
	tb.Helper()
	for done := 0; done < n; {
		k := min(batch, n-done)
		if err := s.StoreLogs(makeLogs(first+uint64(done), k)); err != nil {
			tb.Fatal(err)
		}
		done += k
	}
}

// diskUsage is the space allocated to the files under dir, in MiB.
func diskUsage(tb testing.TB, dir string) float64 {
	tb.Helper()
	var blocks int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Stat(path, &st); err != nil {
			return err
		}
		blocks += st.Blocks
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return float64(blocks*512) / (1 << 20)
}

func openKind(tb testing.TB, k storeKind, dir string) (raft.LogStore, func()) {
	tb.Helper()
	s, closeFn, err := k.open(dir)
	if err != nil {
		tb.Fatal(err)
	}
	return s, func() {
		if err := closeFn(); err != nil {
			tb.Error(err)
		}
	}
}

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
		d, err := os.MkdirTemp("", "raftstore-bench")
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
//	RAFTSTORE_FSYNC_PROBE=wal:/var/tmp/p strace -f -e trace=fsync,fdatasync,write /tmp/raftstore.test
const fsyncProbeEnv = "RAFTSTORE_FSYNC_PROBE"

func fsyncProbe(spec string) int {
	name, dir, _ := strings.Cut(spec, ":")
	for _, k := range kinds {
		if k.name != name {
			continue
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			fmt.Println(err)
			return 1
		}
		s, closeFn, err := k.open(dir)
		if err != nil {
			fmt.Println(err)
			return 1
		}
		last, _ := s.LastIndex()
		os.Stdout.WriteString("opened\n")
		for i := range 5 {
			if err := s.StoreLogs(makeLogs(last+1+uint64(16*i), 16)); err != nil {
				fmt.Println(err)
				return 1
			}
			os.Stdout.WriteString(fmt.Sprintf("stored %d\n", i))
		}
		if err := closeFn(); err != nil {
			fmt.Println(err)
			return 1
		}
		return 0
	}
	fmt.Println("unknown store kind", name)
	return 1
}
