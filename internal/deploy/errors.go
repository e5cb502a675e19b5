package deploy

import (
	"errors"
	"fmt"
	"strings"
)

// FieldError is a problem with one field of a Spec: Field is its path as a
// web form names its inputs (the JSON names of Spec: "port",
// "nodes[1].host", "own_tls.cert_file"), Msg what is wrong, in words that
// read well beside that field.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return "deploy: " + e.Field + ": " + e.Msg }

// FieldErrors are the problems Validate found in a Spec, in the order of
// its fields. A web form shows each beside its field (ByField); errors.As
// finds them in the error of Validate and Plan.
type FieldErrors []*FieldError

func (es FieldErrors) Error() string {
	msgs := make([]string, len(es))
	for i, e := range es {
		msgs[i] = e.Field + ": " + e.Msg
	}
	return "deploy: " + strings.Join(msgs, "; ")
}

// Unwrap returns the errors, for errors.As to a *FieldError.
func (es FieldErrors) Unwrap() []error {
	errs := make([]error, len(es))
	for i, e := range es {
		errs[i] = e
	}
	return errs
}

// ByField returns the messages of es by field, for a form that shows them
// beside its inputs.
func (es FieldErrors) ByField() map[string][]string {
	m := make(map[string][]string)
	for _, e := range es {
		m[e.Field] = append(m[e.Field], e.Msg)
	}
	return m
}

func (es *FieldErrors) add(field, format string, args ...any) {
	*es = append(*es, &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
}

// ExistsError is the refusal of Bundle.WriteDir to overwrite: Path, a file
// of the bundle, exists in Dir.
type ExistsError struct {
	Path, Dir string
}

func (e *ExistsError) Error() string {
	return fmt.Sprintf("%s already exists: %s holds a deployment", e.Path, e.Dir)
}

// ErrNotBundle is the error of LoadCluster for a directory that holds no
// cluster bundle of 'ticketingd init --cluster'.
var ErrNotBundle = errors.New("deploy: not a cluster bundle")
