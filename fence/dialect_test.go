package fence_test

import (
	"errors"
	"testing"

	"github.com/ticketing-dev/ticketing/fence"
)

// TestDialectNames: one name per dialect, goose's (and the migrations'
// directory name), and ParseDialect reads it back.
func TestDialectNames(t *testing.T) {
	for d, want := range map[fence.Dialect]string{
		fence.Postgres: "postgres", fence.MySQL: "mysql", fence.SQLite: "sqlite3", 0: "Dialect(0)",
	} {
		if got := d.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(d), got, want)
		}
		if d == 0 {
			continue
		}
		if got, err := fence.ParseDialect(want); err != nil || got != d {
			t.Errorf("ParseDialect(%q) = %v, %v; want %v", want, got, err, d)
		}
	}
	for s, want := range map[string]fence.Dialect{"postgresql": fence.Postgres, "mariadb": fence.MySQL, "sqlite": fence.SQLite} {
		if got, err := fence.ParseDialect(s); err != nil || got != want {
			t.Errorf("ParseDialect(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "Postgres", "pgx", "Dialect(1)"} {
		if _, err := fence.ParseDialect(s); !errors.Is(err, fence.ErrDialect) {
			t.Errorf("ParseDialect(%q): %v, want ErrDialect", s, err)
		}
	}
}
