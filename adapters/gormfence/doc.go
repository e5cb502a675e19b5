// Package gormfence fences writes made through GORM (gorm.io/gorm) with a
// lock ticket's token, in the same transaction as the write, for
// PostgreSQL (gorm.io/driver/postgres, pgx), MySQL/MariaDB
// (gorm.io/driver/mysql) and SQLite (github.com/glebarez/sqlite, no cgo).
//
// It is a module of its own, github.com/ticketing-dev/ticketing/adapters/gormfence,
// so that the main module does not depend on GORM. Under the hood it is
// package sqlfence on the *sql.Tx of GORM's transaction: the same
// statements, checks, outcomes and errors; see sqlfence and fence.
//
// The dialect comes from the GORM dialector's name (see Dialect). Create
// the high-water table once at start-up with migrations.Up on the
// *sql.DB behind GORM (db.DB()) and the same dialect.
//
// sqlx and ent need no adapter of their own: both run on database/sql,
// so sqlfence.Run fences them (sqlx.Tx wraps the *sql.Tx, ent's
// entsql.Conn drives it); this module's tests show both.
package gormfence
