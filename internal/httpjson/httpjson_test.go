package httpjson

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestIsJSON(t *testing.T) {
	for ct, want := range map[string]bool{"application/json": true, "Application/JSON; charset=utf-8": true, " application/json ;x": true,
		"": false, "text/plain": false, "application/x-www-form-urlencoded": false, "multipart/form-data; boundary=x": false, "application/jsonp": false} {
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("Content-Type", ct)
		if got := IsJSON(r); got != want {
			t.Errorf("IsJSON(%q) = %v", ct, got)
		}
	}
}

func TestDecode(t *testing.T) {
	type body struct{ A int }
	for _, c := range []struct {
		in   string
		code int
		msg  string
	}{
		{`{"A": 1}`, 200, ""},
		{`{"A": 1, "B": 2}`, 400, `unknown field "B"`},
		{`{"A": 1} {}`, 400, "more than one JSON value"},
		{`{"A": "x"}`, 400, "cannot unmarshal"},
		{`{"A": ` + strings.Repeat("1", 100) + `}`, 413, "too large"},
	} {
		var v body
		code, err := Decode(httptest.NewRecorder(), httptest.NewRequest("POST", "/", strings.NewReader(c.in)), 64, &v)
		if code != c.code || (err == nil) != (c.msg == "") || err != nil && (!strings.Contains(err.Error(), c.msg) || !strings.HasPrefix(err.Error(), "invalid request body: ")) {
			t.Errorf("%s: %d %v, want %d %q", c.in, code, err, c.code, c.msg)
		}
		if c.code == http.StatusOK && v.A != 1 {
			t.Errorf("%s: decoded %+v", c.in, v)
		}
	}
}
