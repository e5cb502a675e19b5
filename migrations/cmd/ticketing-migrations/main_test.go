package main

import (
	"bytes"
	"database/sql"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"go.uber.org/goleak"
	_ "modernc.org/sqlite"

	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/internal/testdb"
	"github.com/ticketing-dev/ticketing/migrations"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestExport: the written files are exactly the embedded ones (which are
// the repository's migrations/DIALECT/*.sql), a second run overwrites,
// and other files in DIR stay.
func TestExport(t *testing.T) {
	for _, d := range []fence.Dialect{fence.Postgres, fence.MySQL, fence.SQLite} {
		t.Run(d.String(), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "db", "ticketing")
			var out bytes.Buffer
			if err := run([]string{d.String(), dir}, &out); err != nil {
				t.Fatal(err)
			}
			want := embedded(t, d)
			if got := readDir(t, os.DirFS(dir)); !equal(got, want) {
				t.Fatalf("exported files %v, want the embedded %v", keys(got), keys(want))
			}
			if src := readDir(t, os.DirFS(filepath.Join("..", "..", d.String()))); !equal(src, want) {
				t.Fatalf("embedded files differ from the repository's %s/", d)
			}
			for name := range want {
				if !strings.Contains(out.String(), filepath.Join(dir, name)+"\n") {
					t.Errorf("output %q does not name %s", out.String(), name)
				}
			}
			// A changed file is rewritten, a file of the user's stays.
			first := filepath.Join(dir, keys(want)[0])
			if err := os.WriteFile(first, []byte("-- edited"), 0o666); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "00002_app.sql"), []byte("-- mine"), 0o666); err != nil {
				t.Fatal(err)
			}
			if err := run([]string{d.String(), dir}, &out); err != nil {
				t.Fatal(err)
			}
			got := readDir(t, os.DirFS(dir))
			if got["00002_app.sql"] != "-- mine" {
				t.Error("a file not ours was changed")
			}
			delete(got, "00002_app.sql")
			if !equal(got, want) {
				t.Error("second export did not restore the files")
			}
		})
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"postgres"}, {"postgres", "a", "b"}} {
		if err := run(args, new(bytes.Buffer)); !errors.Is(err, errUsage) {
			t.Errorf("run(%q) = %v, want errUsage", args, err)
		}
	}
	if err := run([]string{"oracle", t.TempDir()}, new(bytes.Buffer)); !errors.Is(err, fence.ErrDialect) {
		t.Errorf("unknown dialect: %v", err)
	}
}

// TestGooseAgrees: the exported directory, applied the way the goose CLI
// applies it (goose's global API with -dir, -table and the dialect),
// is what migrations.Up considers applied: Up afterwards has nothing to
// do, and Down then rolls it back.
func TestGooseAgrees(t *testing.T) {
	for _, tc := range []struct {
		d      fence.Dialect
		driver string
		dsn    func(testing.TB) string
	}{
		{fence.SQLite, "sqlite", testdb.SQLite},
		{fence.Postgres, "pgx", testdb.Postgres},
	} {
		t.Run(tc.d.String(), func(t *testing.T) {
			ctx := t.Context()
			dir := t.TempDir()
			if err := run([]string{tc.d.String(), dir}, new(bytes.Buffer)); err != nil {
				t.Fatal(err)
			}
			db, err := sql.Open(tc.driver, tc.dsn(t))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			goose.SetLogger(goose.NopLogger())
			if err := goose.SetDialect(tc.d.String()); err != nil {
				t.Fatal(err)
			}
			goose.SetTableName(migrations.VersionTable)
			defer goose.SetTableName("goose_db_version")
			if err := goose.UpContext(ctx, db, dir); err != nil {
				t.Fatalf("goose up -dir %s: %v", dir, err)
			}
			if _, err := db.ExecContext(ctx, "SELECT high_water FROM ticketing_fence"); err != nil {
				t.Fatalf("table after goose up: %v", err)
			}
			if got := testdb.AppliedVersions(t, db); got != 1 {
				t.Fatalf("applied versions after goose up = %d, want 1", got)
			}
			if err := migrations.Up(ctx, db, tc.d); err != nil {
				t.Fatalf("migrations.Up after goose up: %v", err)
			}
			if got := testdb.AppliedVersions(t, db); got != 1 {
				t.Fatalf("applied versions after migrations.Up = %d, want still 1", got)
			}
			if err := migrations.Down(ctx, db, tc.d); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, "SELECT 1 FROM ticketing_fence"); err == nil {
				t.Fatal("table still there after Down")
			}
		})
	}
}

func embedded(t *testing.T, d fence.Dialect) map[string]string {
	t.Helper()
	fsys, err := migrations.Files(d)
	if err != nil {
		t.Fatal(err)
	}
	m := readDir(t, fsys)
	if len(m) == 0 {
		t.Fatalf("no embedded files for %v", d)
	}
	return m
}

func readDir(t *testing.T, fsys fs.FS) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := fs.WalkDir(fsys, ".", func(name string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, err := fs.ReadFile(fsys, name)
		m[name] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func equal(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func keys(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
