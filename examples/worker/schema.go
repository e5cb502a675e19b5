package main

import (
	"context"
	"database/sql"

	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/migrations"
)

// schema is the example's own tables, one statement each (go-sql-driver
// runs one statement per Exec unless multiStatements=true).
// job_results.job_id is the primary key: a last line of defence, so that a
// bug could only ever fail a job, never store two results.
var schema = []string{`
CREATE TABLE IF NOT EXISTS jobs (
	id            BIGINT AUTO_INCREMENT PRIMARY KEY,
	payload       VARCHAR(1024) NOT NULL,
	status        VARCHAR(16)   NOT NULL DEFAULT 'pending', -- pending, done
	claimed_by    VARCHAR(64)   NULL,
	claimed_until DATETIME(6)   NULL,
	KEY jobs_pending (status, id)
) ENGINE=InnoDB`, `
CREATE TABLE IF NOT EXISTS job_results (
	job_id     BIGINT        PRIMARY KEY,
	result     VARCHAR(1024) NOT NULL,
	worker     VARCHAR(64)   NOT NULL,
	token      BIGINT        NOT NULL,
	created_at DATETIME(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB`,
}

// setUp creates the fence's high-water table (migrations.Up) and the
// example's tables. A real application runs its migrations with its own
// tool; see package migrations for using the fence migrations with goose.
func setUp(ctx context.Context, db *sql.DB) error {
	if err := migrations.Up(ctx, db, fence.MySQL); err != nil {
		return err
	}
	for _, stmt := range schema {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}

// enqueue adds jobs with the given payloads.
func enqueue(ctx context.Context, db *sql.DB, payloads ...string) error {
	for _, p := range payloads {
		if _, err := db.ExecContext(ctx, "INSERT INTO jobs (payload) VALUES (?)", p); err != nil {
			return err
		}
	}
	return nil
}
