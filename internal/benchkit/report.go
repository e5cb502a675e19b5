package benchkit

import (
	"encoding/json"
	"io"
)

// Report writes a tool's result to w: indented JSON when asJSON (the
// tools' --json, which bench/compare.sh and bench/peers.sh read), else
// through human, the tool's own text.
func Report[T any](w io.Writer, asJSON bool, res T, human func(io.Writer, T)) error {
	if !asJSON {
		human(w, res)
		return nil
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}
