package deploy

import (
	"fmt"
	"path"
	"path/filepath"
	"strings"
)

// ShellQuote quotes s for sh if it holds anything but the characters of
// plain paths.
func ShellQuote(s string) string {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-+:,@", r)) {
			return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
		}
	}
	return s
}

// SSHHost is host as scp wants it: an IPv6 address in brackets.
func SSHHost(host string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]"
	}
	return host
}

// extrasNote is the guide's last paragraph: the bundle's files for
// service managers.
func (p *planner) extrasNote() string {
	note := fmt.Sprintf("\nThe bundle's %s also says how to run it under systemd (a unit per node)\n"+
		"and Docker Compose (%s; %s for the static binary).\n", ReadmeFile, ComposeFile, DockerfileFile)
	if p.s.Kubernetes != nil {
		note += fmt.Sprintf("Kubernetes: kubectl apply -k %s/ (namespace %s, image %s; see %s).\n",
			path.Join(p.s.Dir, KubeDir), p.s.Kubernetes.Namespace, p.s.Kubernetes.Image, ReadmeFile)
	}
	return note
}

// singleGuide is the guide of a single server; listed are the files it
// names in its first line.
func (p *planner) singleGuide(listed []string, caPath string) string {
	a := p.l.single
	dir := p.s.Dir
	var w strings.Builder
	cfgPath := filepath.Join(dir, ConfigFile)
	fmt.Fprintf(&w, "Wrote a ticketingd deployment to %s (%s).\n\n", dir, strings.Join(listed, ", "))
	fmt.Fprintf(&w, "Start the server:\n\n    ticketingd serve --config %s\n\n", ShellQuote(cfgPath))
	switch {
	case a.wildcard:
		fmt.Fprintf(&w, "It listens on %s (all interfaces).\n\n", a.listen)
	case IsLoopbackListen(a.listen):
		fmt.Fprintf(&w, "It listens on %s only: clients on other machines cannot reach it (see --host, --listen).\n\n", a.listen)
	default:
		fmt.Fprintf(&w, "It listens on %s.\n\n", a.listen)
	}
	fmt.Fprintf(&w, "Give each client this URL through its environment: it carries the server address,\n")
	fmt.Fprintf(&w, "the client token and the TLS settings (the token is shown once, here; it is also\n")
	fmt.Fprintf(&w, "in %s):\n\n", filepath.Join(dir, TokensFile))
	fmt.Fprintf(&w, "    export TICKETING_URL='%s'\n\n", p.b.URL)
	fmt.Fprintf(&w, "The URL form is ticketing://[TOKEN@]HOST[:PORT][,HOST[:PORT]...][?ca=PATH|tls=system][&name=NAME];\n")
	fmt.Fprintf(&w, "it holds the token: keep it out of code and repositories.")
	if p.s.TLS == TLSPrivateCA {
		fmt.Fprintf(&w, "\nA client on another machine needs a copy of %s and its path there in ca=.", caPath)
	}
	fmt.Fprintf(&w, "\n\nConnect from Go:\n\n")
	w.WriteString(indent(goSnippet, "    "))
	if p.s.TLS == TLSPrivateCA {
		fmt.Fprintf(&w, "\nThe server certificate is valid for: %s; clients must connect with one of\nthese names. Keep %s offline if you can: it signs certificates every client trusts.\n",
			strings.Join(a.hosts, ", "), filepath.Join(dir, CAKey))
	}
	if p.adm != "" {
		fmt.Fprintf(&w, "\nThe admin listener is on %s (/metrics, /healthz, /status); its token is in %s.\n",
			p.node[0].admin, filepath.Join(dir, AdminTokenFile))
	}
	if len(p.tok) > 1 {
		fmt.Fprintf(&w, "\n%s holds %d client tokens: give each client its own in the URL.\n", filepath.Join(dir, TokensFile), len(p.tok))
	}
	w.WriteString(p.extrasNote())
	return w.String()
}

// goSnippet is the Go code that connects with TICKETING_URL.
const goSnippet = `cfg, err := broker.ParseURL(os.Getenv("TICKETING_URL"))
if err != nil {
    return err
}
b, err := broker.New(cfg)
if err != nil {
    return err
}
defer b.Close()
if err := b.WaitReady(ctx); err != nil { // sessions open in the background
    return err
}
`

// indent puts prefix before every line of s.
func indent(s, prefix string) string {
	lines := strings.SplitAfter(s, "\n")
	var b strings.Builder
	for _, l := range lines {
		if l != "" {
			b.WriteString(prefix + l)
		}
	}
	return b.String()
}

// groupGuide is the guide of a new pair or cluster bundle; caKeys are the
// CA key files in its directory.
func (p *planner) groupGuide(caKeys []string) string {
	dir := p.s.Dir
	nodes := p.l.nodes
	cluster := p.s.Topology == Cluster
	group := string(p.s.Topology)
	var w strings.Builder
	// What was written.
	var made []string
	if cluster {
		var ids []string
		for _, n := range nodes {
			ids = append(ids, n.id)
		}
		fmt.Fprintf(&w, "Wrote a ticketingd cluster bundle for %d nodes (%s) to %s:\n", len(nodes), strings.Join(ids, ", "), dir)
		if p.s.TLS == TLSPrivateCA {
			made = append(made, fmt.Sprintf("a client CA (%s)", CACert))
		}
		if p.s.PeerTLS {
			made = append(made, fmt.Sprintf("a cluster CA for the peer links (%s)", ClusterCACert))
		}
	} else {
		fmt.Fprintf(&w, "Wrote a ticketingd pair bundle (%s, %s) to %s:\n", nodes[0].id, nodes[1].id, dir)
		switch {
		case p.s.TLS == TLSPrivateCA && p.s.PeerTLS:
			made = append(made, fmt.Sprintf("a CA (%s) for the client listeners and the peer link", CACert))
		case p.s.TLS == TLSPrivateCA:
			made = append(made, fmt.Sprintf("a CA (%s) for the client listeners", CACert))
		case p.s.PeerTLS:
			made = append(made, fmt.Sprintf("a CA (%s) for the peer link", CACert))
		}
	}
	if p.adm != "" {
		made = append(made, fmt.Sprintf("the admin token (%s)", AdminTokenFile))
	}
	if len(made) > 0 {
		fmt.Fprintf(&w, "%s,\nand ", strings.Join(made, ", "))
	}
	certs := "certificates"
	if !cluster {
		certs = "node certificate"
	}
	switch {
	case len(made) == 0:
		fmt.Fprintf(&w, "a directory per node with its config, client token and data directory.\n\n")
	case len(caKeys) == 0:
		fmt.Fprintf(&w, "per node a directory with its config, client token and data directory.\n\n")
	default:
		fmt.Fprintf(&w, "per node a directory with its config, %s, client token and data directory.\n\n", certs)
	}

	p.startLines(&w, nodes, caKeys, false, "Start every node, each in its own terminal (or under a service manager):\n\n")
	how := "The primary serves; the backup watches it over the peer link and takes over when the\n" +
		"primary has missed two heartbeats and a client then comes to it. The client addresses: "
	if cluster {
		how = "The nodes find each other through their peers, elect a leader, and only the leader\n" +
			"serves; the others send clients to it. The client addresses: "
	}
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.listen)
	}
	fmt.Fprintf(&w, "\n%s%s.\n\n", how, strings.Join(addrs, ", "))
	fmt.Fprintf(&w, "Give each client this URL: it carries every node's address, the client token, the\n")
	fmt.Fprintf(&w, "TLS settings and the %s's ID (cluster=: a client uses no node of another cluster\n", group)
	fmt.Fprintf(&w, "or pair). The token is shown once, here; it is also in each node's %s:\n\n", TokensFile)
	fmt.Fprintf(&w, "    export TICKETING_URL='%s'\n\n", p.b.URL)
	caPath := absPath(dir, CACert)
	if !p.l.loopback && p.s.TLS == TLSPrivateCA {
		fmt.Fprintf(&w, "A client on another machine needs a copy of %s and its path there in ca=.\n\n", caPath)
	}
	status := `curl -H "Authorization: Bearer $TICKETING_ADMIN_TOKEN" http://` + nodes[0].admin + "/status"
	if cluster {
		status = "ticketingd cluster status --admin " + nodes[0].admin
	}
	if p.adm != "" {
		fmt.Fprintf(&w, "The admin listeners are on each node's loopback (127.0.0.1). On a node's machine\n")
		fmt.Fprintf(&w, "(the admin token is also in %s):\n\n", filepath.Join(dir, AdminTokenFile))
		fmt.Fprintf(&w, "    export TICKETING_ADMIN_TOKEN='%s'\n", p.adm)
	} else {
		fmt.Fprintf(&w, "The admin listeners are on each node's loopback (127.0.0.1), without a token.\nOn a node's machine:\n\n")
		status = strings.Replace(status, `-H "Authorization: Bearer $TICKETING_ADMIN_TOKEN" `, "", 1)
	}
	fmt.Fprintf(&w, "    %s\n\n", status)
	if p.l.loopback {
		fmt.Fprintf(&w, "The admin ports: ")
		for i, n := range nodes {
			if i > 0 {
				fmt.Fprintf(&w, ", ")
			}
			fmt.Fprintf(&w, "%s %s", n.id, n.admin)
		}
		fmt.Fprintf(&w, ".\n")
	}
	if len(caKeys) > 0 {
		var keys []string
		for _, k := range caKeys {
			keys = append(keys, filepath.Join(dir, k))
		}
		it := "they sign"
		if len(keys) == 1 {
			it = "it signs"
		}
		trust := "clients and both nodes"
		switch {
		case cluster && p.s.TLS == TLSPrivateCA:
			trust = "clients and nodes"
		case cluster:
			trust = "the nodes"
		case p.s.TLS != TLSPrivateCA:
			trust = "both nodes"
		}
		fmt.Fprintf(&w, "Keep %s offline if you can:\n%s certificates that %s trust.\n", strings.Join(keys, " and "), it, trust)
	}
	if len(p.tok) > 1 {
		fmt.Fprintf(&w, "\n%s holds %d client tokens: give each client its own in the URL.\n", TokensFile, len(p.tok))
	}
	w.WriteString(p.extrasNote())
	return w.String()
}

// startLines says how to start nodes: on this machine (a loopback
// bundle, after loopbackIntro), or each copied to its machine (caKeys stay
// in the bundle's directory; adding: nodes added to a bundle).
func (p *planner) startLines(w *strings.Builder, nodes []placedNode, caKeys []string, adding bool, loopbackIntro string) {
	dir := p.s.Dir
	if p.l.loopback {
		w.WriteString(loopbackIntro)
		for _, n := range nodes {
			fmt.Fprintf(w, "    ticketingd serve --config %s\n", ShellQuote(filepath.Join(dir, n.id, ConfigFile)))
		}
		return
	}
	if !adding {
		stay := strings.Join(caKeys, " and ") + " stay here"
		if len(caKeys) == 1 {
			stay = caKeys[0] + " stays here"
		}
		if len(caKeys) == 0 {
			stay = "the tokens at the top stay here"
		}
		fmt.Fprintf(w, "Copy each node's directory to its machine (%s,\n", stay)
		fmt.Fprintf(w, "offline if you can), for example:\n\n")
	} else {
		fmt.Fprintf(w, "Copy each new node's directory to its machine and start it there:\n\n")
	}
	for _, n := range nodes {
		fmt.Fprintf(w, "    scp -rp %s %s:ticketing-%s\n", ShellQuote(filepath.Join(dir, n.id)), SSHHost(n.host), n.id)
	}
	if !adding {
		fmt.Fprintf(w, "\nand start each node there (paths in its config are relative to the config file):\n\n")
	} else {
		fmt.Fprintf(w, "\n")
	}
	for _, n := range nodes {
		fmt.Fprintf(w, "    ticketingd serve --config ticketing-%s/%s    # on %s\n", n.id, ConfigFile, n.host)
	}
}
