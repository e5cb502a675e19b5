package sqlfence

import (
	"strings"
	"testing"
)

// The MySQL upsert must not use VALUES(col) in ON DUPLICATE KEY UPDATE
// (deprecated since MySQL 8.0.20, warning 1287, announced for removal)
// nor a row alias (INSERT ... AS new: MySQL 8.0.19+ only, a syntax error
// on MariaDB). It passes the token as parameters instead, and its
// rejection flag is not a value an AUTO_INCREMENT column hands out.
func TestMySQLUpsertPortable(t *testing.T) {
	st, err := statements(MySQL, "ticketing_fence")
	if err != nil {
		t.Fatal(err)
	}
	u := strings.ToUpper(st.upsert)
	if strings.Contains(u, "VALUES(") || strings.Contains(u, ") AS ") {
		t.Errorf("upsert uses VALUES() or a row alias: %s", st.upsert)
	}
	if n := strings.Count(st.upsert, "?"); n != 5 {
		t.Errorf("upsert has %d parameters, bump passes 5", n)
	}
	if !strings.Contains(st.upsert, "LAST_INSERT_ID("+rejectedFlagSQL+")") || rejectedFlag != -1 {
		t.Errorf("rejection flag: %s", st.upsert)
	}
}
