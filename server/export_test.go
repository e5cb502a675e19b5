package server

// Hooks for the black-box tests in package server_test.

// SetCeilingWriter makes servers created after it write their token
// ceiling with f (which may call WriteCeiling to write it for real); the
// returned func restores the real writer.
func SetCeilingWriter(f func(dir string, v uint64) error) (restore func()) {
	old := writeCeilingFunc
	writeCeilingFunc = f
	return func() { writeCeilingFunc = old }
}

// WriteCeiling is the real ceiling writer.
var WriteCeiling = writeCeiling

// FormatCeiling renders a ceiling file's content.
var FormatCeiling = formatCeiling

// (FakeClock, NewFakeClock and SetClock, in fakeclock_test.go, inject the
// scheduler's clock.)
