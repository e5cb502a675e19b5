// Package httpjson reads the JSON request bodies of the admin listener's
// state-changing endpoints (server/admin's cluster changes and expire now,
// the console's deployment planner) the same way: declared
// application/json, one value, no unknown field, a size limit.
package httpjson

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// IsJSON reports whether r declares its body application/json (with any
// parameters). A web page of another origin cannot send that content type
// without a CORS preflight, which the admin listener never grants: the
// check refuses what a cross-site form or a no-cors fetch can post.
func IsJSON(r *http.Request) bool {
	mt, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";")
	return strings.EqualFold(strings.TrimSpace(mt), "application/json")
}

// Decode reads r's body, at most limit bytes, into v: one JSON value
// with no field v does not have. On failure it returns the status to
// answer, 400 (413 beyond limit), and an error whose text starts with
// "invalid request body: ".
func Decode(w http.ResponseWriter, r *http.Request, limit int64, v any) (int, error) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("more than one JSON value")
	}
	if err == nil {
		return http.StatusOK, nil
	}
	code := http.StatusBadRequest
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		code = http.StatusRequestEntityTooLarge
	}
	return code, fmt.Errorf("invalid request body: %w", err)
}
