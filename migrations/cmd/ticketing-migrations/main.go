// Command ticketing-migrations writes the fence's goose SQL migrations,
// the files package migrations embeds, into a directory, for the goose
// CLI (or any tool that reads goose files). From a module that requires
// github.com/ticketing-dev/ticketing:
//
//	go run github.com/ticketing-dev/ticketing/migrations/cmd/ticketing-migrations postgres db/ticketing
//	go run github.com/pressly/goose/v3/cmd/goose@v3.30.1 -dir db/ticketing -table ticketing_goose_version postgres "$DSN" up
//
// Usage:
//
//	ticketing-migrations DIALECT DIR
//
// DIALECT is postgres, mysql or sqlite3 (fence.ParseDialect's names).
// DIR is created if missing; files of the same names are overwritten
// (the files of the module version in your go.mod), other files are left
// alone. It prints the path of every file written. Pass
// -table ticketing_goose_version to goose so that the CLI and
// migrations.Up share one version table.
package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/migrations"
)

const usage = `usage: ticketing-migrations DIALECT DIR

Writes the goose SQL migrations of the fence's high-water table for
DIALECT (postgres, mysql or sqlite3) into DIR, for the goose CLI:

  goose -dir DIR -table ticketing_goose_version DIALECT DSN up
`

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ticketing-migrations:", err)
		if errors.Is(err, errUsage) {
			fmt.Fprint(os.Stderr, usage)
			os.Exit(2)
		}
		os.Exit(1)
	}
}

var errUsage = errors.New("want two arguments, DIALECT and DIR")

func run(args []string, out io.Writer) error {
	if len(args) != 2 {
		return errUsage
	}
	d, err := fence.ParseDialect(args[0])
	if err != nil {
		return err
	}
	return export(d, args[1], out)
}

// export writes the files of dialect d into dir.
func export(d fence.Dialect, dir string, out io.Writer) error {
	fsys, err := migrations.Files(d)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return err
	}
	return fs.WalkDir(fsys, ".", func(name string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return err
		}
		path := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.WriteFile(path, b, 0o666); err != nil {
			return err
		}
		_, err = fmt.Fprintln(out, path)
		return err
	})
}
