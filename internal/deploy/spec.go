package deploy

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// Topology is what a bundle deploys.
type Topology string

const (
	// Single is one server.
	Single Topology = "single"
	// Pair is a hot-standby pair (Binary Star) of the nodes primary and
	// backup.
	Pair Topology = "pair"
	// Cluster is a Raft cluster, of 3 or 5 nodes (other sizes are planned
	// with a warning).
	Cluster Topology = "cluster"
)

// TLSMode is how the client listeners serve TLS.
type TLSMode string

const (
	// TLSOff serves plain TCP.
	TLSOff TLSMode = "off"
	// TLSPrivateCA generates a private CA and a certificate per server.
	TLSPrivateCA TLSMode = "private-ca"
	// TLSOwn uses certificate and key files the operator brings
	// (Spec.OwnTLS), at the same paths on every server machine.
	TLSOwn TLSMode = "own"
)

// Default ports of a Spec: the client port is the protocol's.
const (
	DefaultPort      = wire.DefaultPort
	DefaultPeerPort  = 7225
	DefaultAdminPort = 9225
)

// MaxClientTokens is the most client tokens a bundle holds.
const MaxClientTokens = 100

// The roles of a pair: its nodes' IDs.
const (
	RolePrimary = string(server.PairPrimary)
	RoleBackup  = string(server.PairBackup)
)

// Node is one node of a pair or a cluster.
type Node struct {
	// ID is a cluster node's node-id (1 to 64 letters, digits, '.', '_',
	// '-'); a pair's nodes are "primary" and "backup". It names the node's
	// directory in the bundle.
	ID string `json:"id"`
	// Host is the DNS name or IP address clients and the other nodes reach
	// the node at, without a port ("[::1]" is taken as "::1").
	Host string `json:"host"`
	// ClientPort, PeerPort (the Raft transport of a cluster node, the peer
	// link of a pair node) and AdminPort (on 127.0.0.1) are the node's
	// ports; 0 means the Spec's base port plus k for the k-th node on the
	// same host, so that nodes sharing a host do not collide.
	ClientPort int `json:"client_port,omitempty"`
	PeerPort   int `json:"peer_port,omitempty"`
	AdminPort  int `json:"admin_port,omitempty"`
}

// OwnTLS names the certificate files of TLSOwn: paths on the server
// machines, absolute, which the configs name as they are.
type OwnTLS struct {
	// CertFile and KeyFile are the server certificate chain and its key
	// (required).
	CertFile string `json:"cert_file"`
	KeyFile  string `json:"key_file"`
	// CAFile is the CA clients verify the certificate with, as the client
	// URL's ca=; empty means the system's roots (tls=system).
	CAFile string `json:"ca_file,omitempty"`
}

// Spec is what a bundle deploys. DefaultSpec gives the defaults of a
// topology; the zero value of a field is not always its default.
type Spec struct {
	// Topology is single, pair or cluster.
	Topology Topology `json:"topology"`
	// Frontend names what writes the bundle, for the "written by" of its
	// README, configs, units and compose file: "ticketingd init" when
	// empty (then the configs name its --cluster or --pair). Set by the
	// front end, never from a request.
	Frontend string `json:"-"`
	// Dir is the directory the bundle is written to or unpacked at: the
	// guide names its files there, and the client URL's ca= is the
	// absolute path of its ca.pem (a relative Dir is taken from the
	// current directory). Required; like the paths of OwnTLS, a path with
	// / between its elements and no backslash, colon, ".." element, empty
	// element, NUL or other control character (see badPath).
	Dir string `json:"dir"`

	// Hosts (single only) are the names clients connect to: the server
	// certificate's names; empty means 127.0.0.1 and localhost. When every
	// host is a loopback one the server listens on loopback only, else on
	// all interfaces.
	Hosts []string `json:"hosts,omitempty"`
	// Listen (single only) overrides that choice of listen address
	// (host:port); its port then is the client port.
	Listen string `json:"listen,omitempty"`

	// Nodes (pair and cluster) are the nodes: primary and backup for a
	// pair, 3 or 5 for a cluster.
	Nodes []Node `json:"nodes,omitempty"`

	// Port, PeerPort and AdminPort are the base ports (see Node); 0 means
	// DefaultPort, DefaultPeerPort, DefaultAdminPort. A single server has
	// an admin listener only with AdminToken.
	Port      int `json:"port,omitempty"`
	PeerPort  int `json:"peer_port,omitempty"`
	AdminPort int `json:"admin_port,omitempty"`

	// TLS is the client listeners' TLS; "" means off.
	TLS TLSMode `json:"tls"`
	// OwnTLS are the files of TLSOwn.
	OwnTLS OwnTLS `json:"own_tls"`
	// PeerTLS (pair and cluster) secures the links between the nodes with
	// mutual TLS, with certificates of a generated CA (a cluster's own
	// cluster CA; a pair's CA, which also signs its client certificates).
	PeerTLS bool `json:"peer_tls"`

	// ClientTokens is how many client tokens to generate (1 to
	// MaxClientTokens); the client URL carries the first.
	ClientTokens int `json:"client_tokens"`
	// AdminToken generates an admin token for the admin listeners, which
	// then need it for every request but GET /healthz.
	AdminToken bool `json:"admin_token"`
	// ConsoleKeys turns on the lock browser of the admin listeners (the
	// config's console-keys: the console's Locks page, /v1/locks and an
	// operator's expire now). It needs AdminToken: key names can be
	// sensitive, so the lock browser is served only behind the token.
	ConsoleKeys bool `json:"console_keys,omitempty"`
	// TokenStart is where a new data dir or cluster starts its fencing
	// tokens: "clock" (above the wall clock in microseconds) or "one";
	// "" means clock.
	TokenStart string `json:"token_start,omitempty"`

	// Kubernetes, if not nil, adds Kubernetes manifests to the bundle, in
	// KubeDir (see Kubernetes); a pair is not offered there.
	Kubernetes *Kubernetes `json:"kubernetes,omitempty"`

	// Existing, set by LoadCluster, makes the plan one of nodes added to
	// that cluster bundle: of its CAs and tokens, with
	// initial-cluster-state existing. TLS, OwnTLS, PeerTLS, ClientTokens,
	// AdminToken and TokenStart are then the bundle's.
	Existing *Existing `json:"-"`
}

// DefaultSpec is the Spec 'ticketingd init' starts from for topology t:
// for a pair or cluster, TLS with a private CA, peer mutual TLS and an
// admin token; for a single server, plain TCP without an admin listener.
func DefaultSpec(t Topology) Spec {
	s := Spec{Topology: t, Port: DefaultPort, PeerPort: DefaultPeerPort, AdminPort: DefaultAdminPort,
		TLS: TLSOff, ClientTokens: 1, TokenStart: "clock"}
	if t != Single {
		s.TLS, s.PeerTLS, s.AdminToken = TLSPrivateCA, true, true
	}
	return s
}

// Validate checks s; its error is FieldErrors, every problem found, each
// naming its field.
func Validate(s Spec) error {
	if _, errs := place(s); len(errs) > 0 {
		return errs
	}
	return nil
}

// badPath says what is wrong with p, a path of the bundle's directory or
// of a file on the server machines, or "" if nothing is. The directory's
// last element is the top directory of the archives (Bundle.Root), and
// every path is written into the guide, the configs and the client URL,
// so a path is held to what an archive reader accepts for an entry name
// on every system: no NUL or other control or format character (a newline
// would start a new line of the guide or a config), no backslash (a
// directory separator on Windows: "..\x" climbs out of the directory
// the archive is unpacked in), no colon (a Windows drive, "C:", or an
// NTFS stream), no ".." element and no empty element ("a//b"). A leading
// "/" (an absolute path) and one trailing "/" are taken.
func badPath(p string) string {
	if !utf8.ValidString(p) {
		return "want a path of UTF-8 text"
	}
	for _, r := range p {
		switch {
		case r == 0:
			return "want a path without a NUL byte"
		case unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp):
			return fmt.Sprintf("want a path without control characters (%U)", r)
		case r == '\\':
			return "want a path with / between its directories, without a backslash (which Windows takes as one)"
		case r == ':':
			return "want a path without a colon (a Windows drive letter, C:, or a stream)"
		}
	}
	rest := strings.TrimSuffix(strings.TrimPrefix(p, "/"), "/")
	if rest == "" {
		return "" // "/"
	}
	for _, e := range strings.Split(rest, "/") {
		switch e {
		case "":
			return "want a path without empty elements (//)"
		case "..":
			return "want a path without .. elements: name the directory itself"
		}
	}
	return ""
}

// ValidHost reports whether h can be both a certificate name and the host
// part of a client address: an IP address or a DNS name.
func ValidHost(h string) bool {
	if net.ParseIP(h) != nil {
		return true
	}
	if h == "" || len(h) > 253 {
		return false
	}
	for _, r := range h {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_') {
			return false
		}
	}
	return true
}

// trimBrackets is host without the brackets of "[::1]".
func trimBrackets(host string) string {
	return strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
}

// loopbackIP returns the loopback address h stands for: 127.0.0.1 for
// localhost, the address itself for a loopback IP, and nil for any host
// that may be another machine's name.
func loopbackIP(h string) net.IP {
	if strings.EqualFold(strings.TrimSuffix(h, "."), "localhost") {
		return net.IPv4(127, 0, 0, 1)
	}
	if ip := net.ParseIP(h); ip != nil && ip.IsLoopback() {
		return ip
	}
	return nil
}

// IsLoopbackListen reports whether a listen address accepts connections
// from this machine only (the rule of serve's exposure warning).
func IsLoopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return strings.EqualFold(host, "localhost")
	}
	return ip.IsLoopback()
}

// hostKey is the normalized host of a node: an IP address in its
// canonical form, a name in lower case.
func hostKey(host string) string {
	if ip := net.ParseIP(host); ip != nil {
		return ip.String()
	}
	return strings.ToLower(host)
}

// placedNode is a node with its addresses (host:port): its client
// listener, its link to the other nodes and its admin listener.
type placedNode struct {
	id, host            string
	listen, link, admin string
}

// layout is a checked Spec with its defaults filled in and its addresses
// planned.
type layout struct {
	s        Spec
	single   singleAddrs // Single
	nodes    []placedNode
	loopback bool // pair, cluster: every host is a loopback one
}

// withDefaults fills in the zero values that stand for defaults.
func withDefaults(s Spec) Spec {
	for _, p := range []struct {
		dst *int
		def int
	}{{&s.Port, DefaultPort}, {&s.PeerPort, DefaultPeerPort}, {&s.AdminPort, DefaultAdminPort}} {
		if *p.dst == 0 {
			*p.dst = p.def
		}
	}
	if s.TLS == "" {
		s.TLS = TLSOff
	}
	if s.TokenStart == "" {
		s.TokenStart = "clock"
	}
	if ex := s.Existing; ex != nil {
		s.Topology = Cluster
		s.TLS, s.PeerTLS, s.AdminToken, s.ClientTokens = TLSOff, ex.ClusterCA != nil, ex.AdminToken != "", 1
		switch {
		case ex.ClientCA != nil:
			s.TLS = TLSPrivateCA
		case ex.OwnTLS != nil:
			s.TLS, s.OwnTLS = TLSOwn, *ex.OwnTLS
		}
		if ex.TokenStart != "" {
			s.TokenStart = ex.TokenStart
		}
	}
	return s
}

// linkWhat names the nodes' link port of topology t in messages.
func linkWhat(t Topology) string {
	if t == Pair {
		return "peer port"
	}
	return "Raft port"
}

func validPort(p int) bool { return p >= 1 && p <= 65535 }

// place checks s and plans its addresses.
func place(s Spec) (*layout, FieldErrors) {
	s = withDefaults(s)
	l := &layout{s: s}
	var errs FieldErrors
	if s.Dir == "" {
		errs.add("dir", "the directory the bundle goes to is required")
	} else if msg := badPath(s.Dir); msg != "" {
		errs.add("dir", "%s", msg)
	}
	switch s.TLS {
	case TLSOff, TLSPrivateCA:
	case TLSOwn:
		for _, f := range []struct{ field, path string }{{"own_tls.cert_file", s.OwnTLS.CertFile}, {"own_tls.key_file", s.OwnTLS.KeyFile}, {"own_tls.ca_file", s.OwnTLS.CAFile}} {
			if f.path == "" && f.field != "own_tls.ca_file" {
				errs.add(f.field, "required with your own TLS files")
			} else if f.path != "" && !filepath.IsAbs(f.path) {
				errs.add(f.field, "want an absolute path on the server machines")
			} else if msg := badPath(f.path); f.path != "" && msg != "" {
				errs.add(f.field, "%s", msg)
			}
		}
	default:
		errs.add("tls", "want off, private-ca or own")
	}
	if s.ClientTokens < 1 || s.ClientTokens > MaxClientTokens {
		errs.add("client_tokens", "want 1 to %d", MaxClientTokens)
	}
	if s.ConsoleKeys && !s.AdminToken {
		errs.add("console_keys", "the lock browser needs the admin token: key names can be sensitive")
	}
	if _, err := server.ParseTokenStart(s.TokenStart); err != nil {
		errs.add("token_start", "want one or clock")
	}
	basePorts := []struct {
		field string
		port  int
	}{{"port", s.Port}, {"peer_port", s.PeerPort}, {"admin_port", s.AdminPort}}
	for _, p := range basePorts {
		if !validPort(p.port) {
			errs.add(p.field, "want 1..65535")
		}
	}
	if s.Kubernetes != nil {
		k := *s.Kubernetes // the caller's stays as it was
		s.Kubernetes = &k
		l.s.Kubernetes = &k
		checkKube(&s, &errs)
	}
	switch s.Topology {
	case Single:
		if len(s.Nodes) > 0 {
			errs.add("nodes", "a single server has no nodes: give its hosts")
		}
		if s.PeerTLS {
			errs.add("peer_tls", "only a pair or a cluster has peer links")
		}
		l.single = planSingle(&s, &errs)
		l.s = s
	case Pair, Cluster:
		if len(s.Hosts) > 0 {
			errs.add("hosts", "the nodes name their hosts")
		}
		if s.Listen != "" {
			errs.add("listen", "the nodes' hosts and ports give their listen addresses")
		}
		if s.Port == s.PeerPort || s.Port == s.AdminPort || s.PeerPort == s.AdminPort {
			errs.add("port", "the client, %s and admin base ports must differ", linkWhat(s.Topology))
		}
		if len(errs) == 0 {
			l.nodes, l.loopback = planNodes(s, &errs)
		}
	default:
		errs.add("topology", "want single, pair or cluster")
	}
	return l, errs
}

// planNodes checks the nodes of a pair or cluster and gives every node its
// addresses. The nodes of s.Existing are taken: their IDs and ports; a new
// node on a host of theirs gets the first k whose ports are free.
func planNodes(s Spec, errs *FieldErrors) (nodes []placedNode, loopback bool) {
	what := linkWhat(s.Topology)
	n0 := len(*errs)
	switch {
	case s.Topology == Pair:
		if len(s.Nodes) != 2 {
			errs.add("nodes", "a pair has two nodes, primary and backup")
			return nil, false
		}
		for i, n := range s.Nodes {
			if n.ID != RolePrimary && n.ID != RoleBackup {
				errs.add(fmt.Sprintf("nodes[%d].id", i), "the nodes of a pair are primary and backup")
			}
		}
	case len(s.Nodes) == 0:
		errs.add("nodes", "a cluster needs its nodes (3 or 5)")
	}
	order := make([]int, len(s.Nodes)) // the primary first: it gets the base ports
	for i := range order {
		order[i] = i
	}
	if s.Topology == Pair && s.Nodes[0].ID == RoleBackup && s.Nodes[1].ID == RolePrimary {
		order[0], order[1] = 1, 0
	}
	ids := map[string]bool{}
	onHost := map[string]int{} // host key -> nodes so far
	loopbacks := 0
	used := map[string]string{} // host key + port -> what uses it
	var existing []placedNode
	if s.Existing != nil {
		existing = s.Existing.nodes
	}
	for _, n := range existing {
		ids[n.id] = true
		if loopbackIP(n.host) != nil {
			loopbacks++
		}
		for _, a := range []struct{ addr, what string }{{n.listen, "client port"}, {n.link, what}, {n.admin, "admin port"}} {
			if _, port, err := net.SplitHostPort(a.addr); err == nil {
				used[hostKey(n.host)+" "+port] = n.id + "'s " + a.what
			}
		}
	}
	for _, i := range order {
		n := s.Nodes[i]
		field := fmt.Sprintf("nodes[%d]", i)
		host := trimBrackets(n.Host)
		bad := false
		if n.ID == "." || n.ID == ".." {
			// The ID names the node's directory in the bundle and the
			// archives: "." and ".." would put its files in another.
			errs.add(field+".id", "the ID names the node's directory in the bundle: not %s", n.ID)
			bad = true
		} else if !server.ValidNodeID(n.ID) {
			errs.add(field+".id", "the ID must be 1 to %d letters, digits, '.', '_' or '-'", server.MaxNodeIDLen)
			bad = true
		} else if ids[n.ID] {
			if s.Existing != nil && s.Existing.has(n.ID) {
				errs.add(field+".id", "the bundle has a node %s already (node IDs are never reused)", n.ID)
			} else {
				errs.add(field+".id", "%s is given twice", n.ID)
			}
			bad = true
		}
		ids[n.ID] = true
		if !ValidHost(host) {
			errs.add(field+".host", "want a DNS name or an IP address as HOST, without a port")
			bad = true
		}
		for _, p := range []struct {
			name string
			port int
		}{{"client_port", n.ClientPort}, {"peer_port", n.PeerPort}, {"admin_port", n.AdminPort}} {
			if p.port != 0 && !validPort(p.port) {
				errs.add(field+"."+p.name, "want 1..65535, or empty for the base port")
				bad = true
			}
		}
		if bad {
			continue
		}
		key := hostKey(host)
		k := onHost[key]
		onHost[key]++
		if loopbackIP(host) != nil {
			loopbacks++
		}
		for {
			p, taken, tooMany := placeNode(s, n, host, key, k, used)
			if tooMany != nil {
				errs.add(field+"."+tooMany.Field, "%s", tooMany.Msg)
				break
			}
			if taken != nil && len(existing) > 0 && n.ClientPort == 0 && n.PeerPort == 0 && n.AdminPort == 0 {
				k++ // added to a bundle: the next ports
				continue
			}
			if taken != nil {
				errs.add(field+"."+taken.Field, "%s", taken.Msg)
				break
			}
			for _, a := range []struct{ addr, what string }{{p.listen, "client port"}, {p.link, what}, {p.admin, "admin port"}} {
				_, port, _ := net.SplitHostPort(a.addr)
				used[key+" "+port] = n.ID + "'s " + a.what
			}
			nodes = append(nodes, p)
			break
		}
	}
	if len(*errs) > n0 {
		return nil, false
	}
	if loopbacks != 0 && loopbacks != len(nodes)+len(existing) {
		errs.add("nodes", "hosts mix loopback and other addresses: nodes on other machines cannot reach a node on loopback")
		return nil, false
	}
	return nodes, loopbacks != 0
}

// placeNode gives node n on host its addresses: its own ports, or the base
// ports plus k. taken, if not nil, says which of them another node has
// already (used: host key + port -> what); tooMany, that a base port plus k
// is beyond 65535. Admin listeners are on each node's own loopback: they
// collide only with nodes on the same host.
func placeNode(s Spec, n Node, host, key string, k int, used map[string]string) (p placedNode, taken, tooMany *FieldError) {
	p = placedNode{id: n.ID, host: host}
	what := linkWhat(s.Topology)
	for _, a := range []struct {
		dst        *string
		host       string
		own, base  int
		what, name string
	}{
		{&p.listen, host, n.ClientPort, s.Port, "client port", "client_port"},
		{&p.link, host, n.PeerPort, s.PeerPort, what, "peer_port"},
		{&p.admin, "127.0.0.1", n.AdminPort, s.AdminPort, "admin port", "admin_port"},
	} {
		port := a.own
		if port == 0 {
			port = a.base + k
		}
		if port > 65535 {
			return p, nil, &FieldError{a.name, fmt.Sprintf("too many nodes on %s for the base ports: %s's %s would be %d", host, n.ID, a.what, port)}
		}
		*a.dst = net.JoinHostPort(a.host, strconv.Itoa(port))
		if other, dup := used[key+" "+strconv.Itoa(port)]; dup && taken == nil {
			taken = &FieldError{a.name, fmt.Sprintf("%s's %s %d on %s is also %s", n.ID, a.what, port, host, other)}
		}
	}
	// The node's own ports must differ (its admin listener is on its
	// machine's loopback, its other listeners on its host).
	if taken == nil && (portOf(p.listen) == portOf(p.link) || portOf(p.admin) == portOf(p.listen) || portOf(p.admin) == portOf(p.link)) {
		taken = &FieldError{"client_port", fmt.Sprintf("%s's client, %s and admin ports must differ", n.ID, what)}
	}
	return p, taken, nil
}

// portOf is the port of a host:port address.
func portOf(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return port
}

// singleAddrs are the addresses of a single server: the certificate's
// hosts, the listen address for the config file, and the address printed
// for clients, which is always one of the hosts.
type singleAddrs struct {
	hosts    []string
	listen   string
	wildcard bool   // listen is on all interfaces
	client   string // host:port printed for clients
	port     string
	unserved []string // loopback hosts the loopback listen address does not serve
	unnamed  bool     // Listen is a specific address no host names
}

// planSingle checks the hosts and listen address of a single server and
// plans its addresses.
func planSingle(s *Spec, errs *FieldErrors) singleAddrs {
	var p singleAddrs
	hosts := make([]string, len(s.Hosts))
	for i, h := range s.Hosts {
		hosts[i] = trimBrackets(h)
		if !ValidHost(hosts[i]) {
			errs.add(fmt.Sprintf("hosts[%d]", i), "want a DNS name or an IP address, without a port")
		}
	}
	port := strconv.Itoa(s.Port)
	var lhost string
	if s.Listen != "" {
		var err error
		if lhost, port, err = net.SplitHostPort(s.Listen); err != nil {
			errs.add("listen", "%v", err)
		} else if n, err := strconv.Atoi(port); err != nil || !validPort(n) {
			errs.add("listen", "want a port 1..65535")
		}
	}
	if len(*errs) > 0 {
		return p
	}
	s.Hosts = hosts
	lip := net.ParseIP(lhost)
	p.wildcard = lhost == "" || (lip != nil && lip.IsUnspecified())

	p.hosts = hosts
	if len(p.hosts) == 0 {
		switch ip := loopbackIP(lhost); {
		case p.wildcard || ip != nil && ip.Equal(net.IPv4(127, 0, 0, 1)):
			p.hosts = []string{"127.0.0.1", "localhost"}
		case ip != nil: // ::1, say
			p.hosts = []string{lhost, "localhost"}
		default: // a specific interface: clients reach it by that name
			p.hosts = []string{lhost}
		}
	}

	// The printed host: the first one other machines can reach if there is
	// one (the user named it for remote clients), else the first.
	p.client = p.hosts[0]
	remote := false
	for _, h := range p.hosts {
		if loopbackIP(h) == nil {
			p.client, remote = h, true
			break
		}
	}

	switch {
	case s.Listen != "":
		p.listen = s.Listen
		if !p.wildcard {
			// A specific address: print the host that names it if
			// there is one, else warn.
			p.unnamed = true
			for _, h := range p.hosts {
				if strings.EqualFold(h, lhost) || lip != nil && lip.Equal(net.ParseIP(h)) {
					p.client, p.unnamed = h, false
					break
				}
			}
		}
	case remote:
		p.listen, p.wildcard = net.JoinHostPort("", port), true
	default:
		// Every host is loopback: listen on the printed host's address.
		// localhost counts as served by 127.0.0.1 and ::1 alike (it
		// normally resolves to both, and clients fall back from one to the
		// other); another loopback address is only served if it is that
		// one.
		ip := loopbackIP(p.client)
		p.listen, p.wildcard = net.JoinHostPort(ip.String(), port), false
		for _, h := range p.hosts {
			if hip := loopbackIP(h); net.ParseIP(h) != nil && !hip.Equal(ip) {
				p.unserved = append(p.unserved, h)
			}
		}
	}
	p.port = port
	p.client = net.JoinHostPort(p.client, port)
	return p
}
