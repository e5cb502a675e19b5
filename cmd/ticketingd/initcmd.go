package main

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/ticketing-dev/ticketing/internal/deploy"
	"github.com/ticketing-dev/ticketing/internal/wire"
)

// Names of the files 'ticketingd init' writes (internal/deploy): in DIR,
// a single server's files, or a bundle's CAs, admin token and client
// tokens; in DIR/ID, a pair's or cluster's node files.
const (
	initConfigFile     = deploy.ConfigFile
	initTokensFile     = deploy.TokensFile
	initDataDir        = deploy.DataDir
	initCACert         = deploy.CACert
	initCAKey          = deploy.CAKey
	initServerCert     = deploy.ServerCert
	initServerKey      = deploy.ServerKey
	initClusterCACert  = deploy.ClusterCACert
	initClusterCAKey   = deploy.ClusterCAKey
	initNodeCert       = deploy.NodeCert
	initNodeKey        = deploy.NodeKey
	initAdminTokenFile = deploy.AdminTokenFile
)

// Default ports of 'ticketingd init --cluster' and 'init --pair' (the
// client port is wire.DefaultPort).
const (
	defaultRaftPort  = deploy.DefaultPeerPort
	defaultPeerPort  = deploy.DefaultPeerPort
	defaultAdminPort = deploy.DefaultAdminPort
)

// The nodes of a pair bundle: their --node names, directories and
// node-name are their roles.
var pairRoles = []string{deploy.RolePrimary, deploy.RoleBackup}

type initOptions struct {
	Dir    string
	Hosts  []string
	TLS    bool
	Force  bool
	Listen string // empty: derived from Hosts and Port
	Port   int

	// --cluster: a bundle for a Raft cluster.
	Cluster   bool
	Add       bool     // add Nodes to the bundle in Dir
	Nodes     []string // ID=HOST
	RaftPort  int
	AdminPort int

	// --pair: a bundle for a hot-standby pair, of the Nodes primary and
	// backup, on AdminPort too.
	Pair     bool
	PeerPort int

	// ConsoleKeys (--cluster, --pair): console-keys: true in every
	// node's config, the lock browser.
	ConsoleKeys bool

	// --kubernetes: the bundle's manifests in k8s/, for the namespace
	// and the image.
	Kubernetes   bool
	K8sNamespace string
	K8sImage     string
}

func newInitCmd(stdout io.Writer) *cobra.Command {
	var o initOptions
	cmd := &cobra.Command{
		Use:   "init --dir DIR [--host NAME ...] [--tls] [--port N | --listen ADDR] | init --cluster --dir DIR --node ID=HOST ... | init --pair --dir DIR --node primary=HOST --node backup=HOST",
		Short: "Write a ready deployment: config file, client token, and optionally a TLS CA and server certificate; or a cluster or pair bundle",
		Long: `Write a ready deployment into DIR:

  ticketingd.yaml    config file for 'ticketingd serve --config'
  client-tokens      one random client token (mode 0600); printed once
  data/              the data directory (token store)
  ca.pem, ca-key.pem           with --tls: a private CA (ECDSA P-256)
  server.pem, server-key.pem   with --tls: a server certificate for every --host
  ticketingd.service, Dockerfile, .dockerignore, compose.yaml, README.md
                     to run it under systemd or Docker Compose (see README.md)

--host names the server as its clients reach it. Hosts that parse as IP
addresses become IP SANs, others DNS SANs; the default hosts are 127.0.0.1
and localhost. When every host is a loopback one (localhost, 127.0.0.1, ::1)
the config listens on loopback only (127.0.0.1:PORT); otherwise on all
interfaces (:PORT). --listen overrides that choice.

init then prints how a client connects: one TICKETING_URL
(ticketing://TOKEN@HOST:PORT?ca=CA.PEM) for broker.ParseURL, which carries
the address, the client token and the TLS settings, using the first host
other machines can reach. init refuses to overwrite an
existing deployment unless --force is given.

With --cluster, init writes a bundle for a Raft cluster instead, one
--node ID=HOST per node (3 or 5 of them): a client CA (ca.pem), a cluster
CA for the peer links (cluster-ca.pem), and per node a directory DIR/ID
with its config (ticketingd.yaml), server and node certificates, the
client token, a data directory and a systemd unit (ticketingd-ID.service);
the bundle's Dockerfile, compose.yaml and README.md are as for one node. Each node listens on HOST:--port, its
Raft transport on HOST:--raft-port and its admin listener on
127.0.0.1:--admin-port; nodes that share a host get the next ports (port+1,
port+2, ...), so that a bundle of nodes all on 127.0.0.1 runs on one
machine. Every node's config has the bundle's cluster-id, a random one.
init then prints how to start each node and the TICKETING_URL listing
every node, with the client token and the cluster ID (cluster=ID).

With --pair, init writes a bundle for a hot-standby pair instead, of the
nodes --node primary=HOST and --node backup=HOST: one CA (ca.pem), and per
node a directory DIR/primary and DIR/backup with its config (pair,
pair-id, peer, peer-listen, advertise), a node certificate for its host that serves both
its client listener and the peer link, the client token and a data
directory. Each node listens on HOST:--port, its peer link on
HOST:--peer-port and its admin listener on 127.0.0.1:--admin-port; when the
two share a host the backup gets the next ports. The output is as for
--cluster, the URL's cluster= being the pair's pair-id.

With --kubernetes, a single server's or a cluster's bundle also holds
Kubernetes manifests in DIR/k8s (kubectl apply -k DIR/k8s): a StatefulSet
whose pods are the nodes (ticketing-0, ticketing-1, ...; their names are
the node IDs), a headless Service naming them, a client Service, a
PodDisruptionBudget for a cluster, the config as a ConfigMap and the
tokens, keys and certificates as a Secret, for the namespace
--k8s-namespace and the image --k8s-image (a placeholder to replace by
default). It always generates an admin token: the probes ask /healthz on
the pod's address. A pair is not offered on Kubernetes. See
docs/kubernetes.md.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.Dir == "" {
				return usagef("--dir is required")
			}
			if o.Cluster && o.Pair {
				return usagef("--cluster and --pair exclude each other")
			}
			for _, name := range []string{"k8s-namespace", "k8s-image"} {
				if cmd.Flags().Changed(name) && !o.Kubernetes {
					return usagef("--%s needs --kubernetes", name)
				}
			}
			if o.Cluster {
				return initClusterCmd(cmd, &o, stdout)
			}
			if o.Pair {
				return initPairCmd(cmd, &o, stdout)
			}
			for _, f := range []struct{ name, needs string }{
				{"node", "--cluster or --pair"}, {"raft-port", "--cluster"}, {"peer-port", "--pair"},
				{"admin-port", "--cluster or --pair"}, {"add", "--cluster"}, {"console-keys", "--cluster or --pair (a single server's init writes no admin token, which the lock browser needs)"},
			} {
				if cmd.Flags().Changed(f.name) {
					return usagef("--%s needs %s", f.name, f.needs)
				}
			}
			if cmd.Flags().Changed("listen") && cmd.Flags().Changed("port") {
				return usagef("--listen and --port exclude each other: put the port into --listen")
			}
			if o.Port < 1 || o.Port > 65535 {
				return usagef("invalid --port %d: want 1..65535", o.Port)
			}
			spec := deploy.DefaultSpec(deploy.Single)
			spec.Dir, spec.Hosts, spec.Listen, spec.Port = o.Dir, o.Hosts, o.Listen, o.Port
			if o.TLS {
				spec.TLS = deploy.TLSPrivateCA
			}
			return initWrite(cmd, &o, spec, nil, stdout)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Dir, "dir", "", "`directory` to write the deployment into (created if missing)")
	f.StringArrayVar(&o.Hosts, "host", nil, "host `name` or IP clients connect to: the server certificate's names with --tls (repeatable; default 127.0.0.1 and localhost)")
	f.BoolVar(&o.TLS, "tls", false, "also create a private CA and a server certificate")
	f.BoolVar(&o.Force, "force", false, "overwrite an existing deployment in --dir")
	f.IntVar(&o.Port, "port", wire.DefaultPort, "TCP `port` to listen on and to print in the client settings")
	f.StringVar(&o.Listen, "listen", "", "listen `address` to put into the config file (default: 127.0.0.1:PORT when every --host is loopback, else :PORT, all interfaces)")
	f.BoolVar(&o.Cluster, "cluster", false, "write a bundle for a Raft cluster of the --node nodes (always with TLS)")
	f.BoolVar(&o.Add, "add", false, "with --cluster: add the --node nodes to the bundle in --dir (its CAs and tokens), for 'ticketingd cluster add'")
	f.StringArrayVar(&o.Nodes, "node", nil, "with --cluster: a node as `ID=HOST`, its --node-id and the host name or IP that clients and the other nodes reach it at (repeatable, 3 or 5 times); with --pair: primary=HOST and backup=HOST, once each")
	f.IntVar(&o.RaftPort, "raft-port", defaultRaftPort, "with --cluster: TCP `port` of each node's Raft transport (nodes sharing a host: the next ones)")
	f.BoolVar(&o.Pair, "pair", false, "write a bundle for a hot-standby pair of the --node nodes primary and backup (always with TLS)")
	f.IntVar(&o.PeerPort, "peer-port", defaultPeerPort, "with --pair: TCP `port` of each node's peer link (nodes sharing a host: the next one)")
	f.IntVar(&o.AdminPort, "admin-port", defaultAdminPort, "with --cluster or --pair: TCP `port` of each node's admin listener on 127.0.0.1 (nodes sharing a host: the next ones)")
	f.BoolVar(&o.ConsoleKeys, "console-keys", false, "with --cluster or --pair: turn on the lock browser of every node's admin listener (console-keys: true): key names, expire now, behind the admin token")
	f.BoolVar(&o.Kubernetes, "kubernetes", false, "also write Kubernetes manifests into DIR/k8s (a single server or a cluster; with an admin token)")
	f.StringVar(&o.K8sNamespace, "k8s-namespace", deploy.DefaultKubeNamespace, "with --kubernetes: the `namespace` of the objects and of the pods' DNS names")
	f.StringVar(&o.K8sImage, "k8s-image", deploy.DefaultKubeImage, "with --kubernetes: the ticketingd container `image` the StatefulSet runs (build it with the bundle's Dockerfile and push it)")
	return cmd
}
