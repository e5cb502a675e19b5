// Package deploy plans the deployment bundles of Ticketing: what
// 'ticketingd init' writes, and what the deployment page offers for
// download. Both front ends call it the same way:
//
//	spec := deploy.DefaultSpec(deploy.Cluster)
//	spec.Dir = "/srv/ticketing"
//	spec.Nodes = []deploy.Node{{ID: "n1", Host: "10.0.0.1"}, {ID: "n2", Host: "10.0.0.2"}, {ID: "n3", Host: "10.0.0.3"}}
//	b, err := deploy.Plan(spec) // or deploy.Validate(spec) alone
//	var fes deploy.FieldErrors
//	if errors.As(err, &fes) {
//		// fes.ByField(): the messages to show beside each form field
//	}
//	err = b.WriteDir(spec.Dir, false) // or b.WriteTarGz(w), b.WriteZip(w)
//	fmt.Print(b.Guide)               // how to start it; b.URL is the TICKETING_URL
//
// A Spec is the topology (a single server, a hot-standby pair, a Raft
// cluster of 3 or 5 nodes), each node's host and ports, the client TLS
// (off, a generated private CA, or the operator's own files), mutual TLS
// on the peer links, the number of client tokens, an admin token, the lock
// browser (console-keys, which needs the admin token) and where tokens
// start. Validate reports every problem as a FieldError naming its
// field by the Spec's JSON names ("nodes[1].host"), so that a web form
// can show it next to the input.
//
// Plan makes a Bundle: a list of files with their modes (private keys,
// tokens and configs holding a token 0600, certificates and the rest
// 0644, directories 0700), the guide 'ticketingd init' prints, and the
// client URL. The configs are rendered from the typed Config with
// gopkg.in/yaml.v3, comments included. Beside them a bundle has a
// hardened systemd unit per node, a Dockerfile of the static binary (FROM
// scratch: it builds offline), a compose.yaml of the whole topology, and
// a README with the start commands and the Go client snippet.
//
// Every Plan draws new keys (internal/pki) and tokens from crypto/rand.
// The package logs nothing; a Bundle holds secrets (File.Secret marks
// them) and is not to be logged, cached or kept beyond its use. For a
// preview that must not show them, Bundle.Preview gives a file's text
// with its private key or tokens hidden, and Bundle.Mask hides the tokens
// in the guide or the URL.
package deploy
