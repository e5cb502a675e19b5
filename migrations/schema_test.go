package migrations_test

import (
	"strings"
	"testing"

	"github.com/ticketing-dev/ticketing/migrations"
)

// The table's constraints, per dialect: the resource is 1 to 255 bytes,
// the high-water is not negative and not NULL, the resource is the
// primary key and compares bytes exactly ('a' and 'a ' and 'A' are three
// rows, no PAD SPACE or case folding).
func TestSchemaConstraints(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			ctx := t.Context()
			db := open(t, d)
			if err := migrations.Up(ctx, db, d.dialect); err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"a", "a ", "A", "a\x00", "\xff"} {
				if _, err := db.ExecContext(ctx, d.insert, []byte(k), 1); err != nil {
					t.Fatalf("insert %q: %v", k, err)
				}
			}
			for _, tc := range []struct {
				name     string
				resource []byte
				hw       any
			}{
				{"duplicate", []byte("a"), 2},
				{"negative high-water", []byte("n"), -1},
				{"NULL high-water", []byte("z"), nil},
				{"empty resource", []byte{}, 1},
				{"256-byte resource", []byte(strings.Repeat("x", 256)), 1},
			} {
				if _, err := db.ExecContext(ctx, d.insert, tc.resource, tc.hw); err == nil {
					t.Errorf("%s: accepted", tc.name)
				}
			}
		})
	}
}
