package main

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/migrations"
)

// schema is the example's own tables, one statement each (go-sql-driver
// runs one statement per Exec unless multiStatements=true). Their names
// carry the prefix ticketing_example_, so that they cannot be confused
// with an application's own jobs tables in the same database.
// ticketing_example_job_results.job_id is the primary key: a last line of
// defence, so that a bug could only ever fail a job, never store two
// results.
var schema = []string{`
CREATE TABLE IF NOT EXISTS ticketing_example_jobs (
	id            BIGINT AUTO_INCREMENT PRIMARY KEY,
	payload       VARCHAR(1024) NOT NULL,
	status        VARCHAR(16)   NOT NULL DEFAULT 'pending', -- pending, done
	claimed_by    VARCHAR(64)   NULL,
	claimed_until DATETIME(6)   NULL,
	KEY jobs_pending (status, id)
) ENGINE=InnoDB`, `
CREATE TABLE IF NOT EXISTS ticketing_example_job_results (
	job_id     BIGINT        PRIMARY KEY,
	result     VARCHAR(1024) NOT NULL,
	worker     VARCHAR(64)   NOT NULL,
	token      BIGINT        NOT NULL,
	created_at DATETIME(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB`,
}

// tableColumns are the columns the example uses, per table: a table of
// that name without them is not the example's (CREATE TABLE IF NOT EXISTS
// keeps whatever table exists).
var tableColumns = []struct {
	table   string
	columns []string
}{
	{"ticketing_example_jobs", []string{"id", "payload", "status", "claimed_by", "claimed_until"}},
	{"ticketing_example_job_results", []string{"job_id", "result", "worker", "token", "created_at"}},
}

// setUp creates the fence's high-water table (migrations.Up) and the
// example's tables, and checks that tables of those names that already
// existed are the example's. A real application runs its migrations with
// its own tool; see package migrations for using the fence migrations
// with goose.
func setUp(ctx context.Context, db *sql.DB) error {
	if err := migrations.Up(ctx, db, fence.MySQL); err != nil {
		return err
	}
	for _, stmt := range schema {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	for _, tc := range tableColumns {
		if err := checkColumns(ctx, db, tc.table, tc.columns); err != nil {
			return err
		}
	}
	return nil
}

// checkColumns fails, naming what is missing, if table (in the current
// database) lacks one of the columns in want.
func checkColumns(ctx context.Context, db *sql.DB, table string, want []string) error {
	rows, err := db.QueryContext(ctx, `SELECT column_name FROM information_schema.columns
		WHERE table_schema = DATABASE() AND table_name = ?`, table)
	if err != nil {
		return err
	}
	defer rows.Close()
	var have []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			return err
		}
		have = append(have, strings.ToLower(c))
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var missing []string
	for _, c := range want {
		if !slices.Contains(have, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("a table %s already exists without the column(s) %s that this example needs (it has %s): it is not this example's; drop or rename it, or point DATABASE_URL at another database",
			table, strings.Join(missing, ", "), strings.Join(have, ", "))
	}
	return nil
}

// enqueue adds jobs with the given payloads.
func enqueue(ctx context.Context, db *sql.DB, payloads ...string) error {
	for _, p := range payloads {
		if _, err := db.ExecContext(ctx, "INSERT INTO ticketing_example_jobs (payload) VALUES (?)", p); err != nil {
			return err
		}
	}
	return nil
}
