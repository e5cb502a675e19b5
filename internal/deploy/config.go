package deploy

import (
	"bytes"
	"fmt"
	"slices"
	"time"

	"gopkg.in/yaml.v3"
)

// Config is a ticketingd.yaml of a bundle: the keys 'ticketingd serve
// --config' reads (its flag names) that a bundle sets. Relative paths are
// relative to the file.
type Config struct {
	Listen           string `yaml:"listen"`
	DataDir          string `yaml:"data-dir"`
	ClientTokensFile string `yaml:"client-tokens-file"`
	TLSCert          string `yaml:"tls-cert,omitempty"`
	TLSKey           string `yaml:"tls-key,omitempty"`

	// A cluster node's.
	Cluster      bool   `yaml:"cluster,omitempty"`
	ClusterID    string `yaml:"cluster-id,omitempty"`
	InitialState string `yaml:"initial-cluster-state,omitempty"`
	NodeID       string `yaml:"node-id,omitempty"`
	// A pair node's.
	Pair   string `yaml:"pair,omitempty"`
	PairID string `yaml:"pair-id,omitempty"`

	NodeName    string   `yaml:"node-name,omitempty"`
	RaftListen  string   `yaml:"raft-listen,omitempty"`
	Peer        string   `yaml:"peer,omitempty"`
	PeerListen  string   `yaml:"peer-listen,omitempty"`
	Advertise   string   `yaml:"advertise,omitempty"`
	Peers       []string `yaml:"peers,omitempty"`
	PeerTLSCert string   `yaml:"peer-tls-cert,omitempty"`
	PeerTLSKey  string   `yaml:"peer-tls-key,omitempty"`
	PeerTLSCA   string   `yaml:"peer-tls-ca,omitempty"`
	// PeerPlaintext: a pair without peer TLS off loopback (the node
	// refuses a plain TCP peer link off loopback without it).
	PeerPlaintext bool `yaml:"peer-plaintext,omitempty"`

	AdminListen string `yaml:"admin-listen,omitempty"`
	AdminToken  string `yaml:"admin-token,omitempty"`
	ConsoleKeys bool   `yaml:"console-keys,omitempty"`

	TokenStart      string        `yaml:"token-start,omitempty"`
	LogLevel        string        `yaml:"log-level"`
	LogFormat       string        `yaml:"log-format"`
	ShutdownTimeout time.Duration `yaml:"shutdown-timeout"`
}

// quotedKeys are the keys whose values a bundle writes in double quotes:
// addresses (host:port) and the admin token.
var quotedKeys = map[string]bool{"listen": true, "raft-listen": true, "advertise": true, "peers": true,
	"peer": true, "peer-listen": true, "admin-listen": true, "admin-token": true}

// comment is what a config says of a key: lines before it (head, each
// starting with #; a leading "\n" is a blank line before them) and after
// its value on its line.
type comment struct{ head, line string }

// configDoc is a Config with its comments, rendered by yaml.v3.
type configDoc struct {
	cfg      Config
	head     string             // the file's first comment lines
	comments map[string]comment // by key
	last     []string           // keys moved to the end, in this order
	foot     string             // comment lines right after the last key
}

// render encodes d.cfg as a YAML mapping, in the order of Config's fields
// but d.last, with the comments of d.
func (d configDoc) render() ([]byte, error) {
	var n yaml.Node
	if err := n.Encode(d.cfg); err != nil {
		return nil, fmt.Errorf("deploy: encode config: %w", err)
	}
	var rest, tail []*yaml.Node
	tail = make([]*yaml.Node, 2*len(d.last))
	for i := 0; i < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if quotedKeys[k.Value] {
			v.Style = yaml.DoubleQuotedStyle
			for _, item := range v.Content {
				item.Style = yaml.DoubleQuotedStyle
			}
		}
		if c, ok := d.comments[k.Value]; ok {
			k.HeadComment, k.LineComment = c.head, c.line
		}
		if j := slices.Index(d.last, k.Value); j >= 0 {
			tail[2*j], tail[2*j+1] = k, v
			continue
		}
		rest = append(rest, k, v)
	}
	for _, t := range tail {
		if t != nil {
			rest = append(rest, t)
		}
	}
	n.Content = rest
	n.HeadComment = d.head
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&n); err != nil {
		return nil, fmt.Errorf("deploy: encode config: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("deploy: encode config: %w", err)
	}
	if d.foot != "" { // as yaml.v3 would put it, but without a blank line before
		buf.WriteString(d.foot + "\n")
	}
	return buf.Bytes(), nil
}
