package logstore

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/ticketing-dev/ticketing/internal/raftstore"
	"go.etcd.io/bbolt"
)

// payloadSize is the size of a log entry's data, about a grant command.
const payloadSize = 64

// trailingLogs is raft's default Config.TrailingLogs: what a compaction
// after a snapshot keeps.
const trailingLogs = 10240

// lockTimeout is raftstore's: the wait for raft.db's file lock.
const lockTimeout = 2 * time.Second

// store is an open log and stable store, and what closes them.
type store struct {
	log    raft.LogStore
	stable raft.StableStore
	close  func() error
}

type storeKind struct {
	name string
	open func(dir string) (store, error)
	// truncates makes TestCrashKill9's child truncate the tail too.
	truncates bool
}

// kinds are the stores the benchmarks compare.
var kinds = []storeKind{
	{"bolt", openBolt, true},
	// Without truncations: with them raft-wal v0.4.1 fails TestCrashKill9
	// in about 1 run of 10 with "segment is sealed" (doc.go).
	{"wal", func(dir string) (store, error) { return openWAL(dir, 0) }, false},
	{"raftlog", openRaftstore, true},
}

// openRaftstore opens internal/raftstore.Open's stores: the log in
// internal/raftlog (dir/log, 64 MiB segments, behind a raft.LogCache), the
// stable store in raft-boltdb (dir/raft.db). The log speaks the types of
// the product's copy of hashicorp/raft: productLog (adapt_test.go) makes it
// an upstream raft.LogStore.
func openRaftstore(dir string) (store, error) {
	s, err := raftstore.Open(dir, nil)
	if err != nil {
		return store{}, err
	}
	return store{productLog{s.Log}, s.Stable, s.Close}, nil
}

// wal64KiB is raft-wal with small segments: a rotation every few appends.
// It does not truncate the tail in TestCrashKill9: it is there to show
// raft-wal v0.4.1's sealed-segment failure as it was found.
var wal64KiB = storeKind{"wal-64KiB", func(dir string) (store, error) { return openWAL(dir, 64<<10) }, false}

func kindByName(name string) (storeKind, bool) {
	for _, k := range append(kinds, wal64KiB) {
		if k.name == name {
			return k, true
		}
	}
	return storeKind{}, false
}

// openBolt opens raft-boltdb in dir/raft.db as internal/raftstore.Open does
// (that package is internal to the main module, so it cannot be imported
// here): the options below are a copy of Open's, and
// TestBoltOptionsAreRaftstores keeps them so. Every StoreLogs and every
// stable Set is fsync'd before it returns (raft-boltdb's default).
func openBolt(dir string) (store, error) {
	path := filepath.Join(dir, "raft.db")
	db, err := raftboltdb.New(raftboltdb.Options{Path: path, BoltOptions: &bbolt.Options{Timeout: lockTimeout, FreelistType: bbolt.FreelistArrayType}})
	if err != nil {
		return store{}, err
	}
	return store{db, db, db.Close}, nil
}

// openWAL opens a raft-wal log in dir with segments of segmentSize bytes
// (0: the default, 64 MiB). Its close func closes the log and its metadata
// file: wal.WAL.Close leaves the metadata (bbolt) file open and locked, so a
// reopen in the same process would block forever.
func openWAL(dir string, segmentSize int) (store, error) {
	meta := &metadb.BoltMetaDB{}
	w, err := wal.Open(dir, wal.WithMetaStore(meta), wal.WithLogger(hclog.NewNullLogger()), wal.WithSegmentSize(segmentSize))
	if err != nil {
		meta.Close()
		return store{}, err
	}
	return store{w, w, func() error {
		err := w.Close()
		if merr := meta.Close(); err == nil {
			err = merr
		}
		return err
	}}, nil
}

func openKind(tb testing.TB, k storeKind, dir string) (raft.LogStore, func()) {
	tb.Helper()
	s, err := k.open(dir)
	if err != nil {
		tb.Fatal(err)
	}
	return s.log, func() {
		if err := s.close(); err != nil {
			tb.Error(err)
		}
	}
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

// boltSetup returns, as source text without white space (and without a
// trailing comma before a closing brace), the raftboltdb.Options literal and
// the value of lockTimeout in the Go file at path.
func boltSetup(t *testing.T, path string) (options, timeout string) {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	text := func(n ast.Node) string {
		var b bytes.Buffer
		if err := printer.Fprint(&b, fset, n); err != nil {
			t.Fatal(err)
		}
		return strings.ReplaceAll(strings.Join(strings.Fields(b.String()), ""), ",}", "}")
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CompositeLit:
			if sel, ok := n.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Options" {
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == "raftboltdb" {
					if options != "" {
						t.Fatalf("%s: more than one raftboltdb.Options literal", path)
					}
					options = text(n)
				}
			}
		case *ast.ValueSpec:
			for i, name := range n.Names {
				if name.Name == "lockTimeout" && i < len(n.Values) {
					timeout = text(n.Values[i])
				}
			}
		}
		return true
	})
	if options == "" || timeout == "" {
		t.Fatalf("%s: no raftboltdb.Options literal (%q) or lockTimeout (%q)", path, options, timeout)
	}
	return options, timeout
}

// TestBoltOptionsAreRaftstores checks that openBolt opens raft-boltdb as
// internal/raftstore.Open does: the same Options literal, the same lock
// timeout.
func TestBoltOptionsAreRaftstores(t *testing.T) {
	theirs := filepath.Join("..", "..", "internal", "raftstore", "raftstore.go")
	if _, err := os.Stat(theirs); err != nil {
		t.Skipf("internal/raftstore not beside this module: %v", err)
	}
	wantOpts, wantTimeout := boltSetup(t, theirs)
	gotOpts, gotTimeout := boltSetup(t, "stores_test.go")
	if gotOpts != wantOpts {
		t.Errorf("openBolt's options:\n\t%s\ninternal/raftstore.Open's:\n\t%s", gotOpts, wantOpts)
	}
	if gotTimeout != wantTimeout {
		t.Errorf("lockTimeout = %s here, %s in internal/raftstore", gotTimeout, wantTimeout)
	}
}
