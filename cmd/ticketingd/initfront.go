package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ticketing-dev/ticketing/internal/deploy"
)

// The init commands are a front end of internal/deploy, as the deployment
// page is: flags -> deploy.Spec -> deploy.Plan -> Bundle.WriteDir, then
// the guide on stdout and the warnings on stderr. What is left here is
// about flags: which go together, and how the plan's field errors read as
// flag errors.

// initWrite plans spec, writes the bundle into o.Dir and prints its
// guide; nodes are the --node entries of spec.Nodes, for errors.
func initWrite(cmd *cobra.Command, o *initOptions, spec deploy.Spec, nodes []string, stdout io.Writer) error {
	if o.Kubernetes {
		// The probes reach /healthz on the pod's address: an admin
		// listener off loopback, which needs the admin token.
		spec.Kubernetes, spec.AdminToken = &deploy.Kubernetes{Namespace: o.K8sNamespace, Image: o.K8sImage}, true
	}
	b, err := deploy.Plan(spec)
	if err != nil {
		return initSpecError(err, o, nodes)
	}
	if err := b.WriteDir(o.Dir, o.Force); err != nil {
		var ee *deploy.ExistsError
		if errors.As(err, &ee) {
			return runtimef("%v; use --force to overwrite it", ee)
		}
		return runtimef("%w", err)
	}
	fmt.Fprint(stdout, b.Guide)
	for _, w := range b.Warnings {
		fmt.Fprintf(cmd.ErrOrStderr(), "ticketingd init: warning: %s\n", w)
	}
	return nil
}

// initSpecError is the first field error of a plan as a usage error that
// names the flag; nodes are the --node entries of the Spec's nodes.
func initSpecError(err error, o *initOptions, nodes []string) error {
	var fes deploy.FieldErrors
	if !errors.As(err, &fes) || len(fes) == 0 {
		return runtimef("%w", err)
	}
	fe := fes[0]
	_, linkFlag, _ := o.linkPort()
	field, sub, _ := strings.Cut(fe.Field, ".")
	name, idx, _ := strings.Cut(strings.TrimSuffix(field, "]"), "[")
	i, _ := strconv.Atoi(idx)
	switch {
	case name == "nodes" && idx != "" && (sub == "id" || sub == "host"):
		return usagef("invalid --node %q: %s", nodes[i], fe.Msg)
	case name == "nodes" && idx != "": // a port
		msg := strings.Replace(fe.Msg, "the base ports", "the ports from --port, --"+linkFlag+" and --admin-port", 1)
		if !strings.HasPrefix(fe.Msg, "too many") {
			msg += ": choose --port, --" + linkFlag + " and --admin-port further apart"
		}
		return usagef("%s", msg)
	case name == "nodes":
		return usagef("--node %s", fe.Msg)
	case name == "hosts":
		return usagef("invalid --host %q: %s", o.Hosts[i], fe.Msg)
	case name == "listen":
		return usagef("invalid --listen %q: %s", o.Listen, fe.Msg)
	case name == "port":
		return usagef("invalid --port %d: %s", o.Port, fe.Msg)
	case name == "peer_port":
		port, _, _ := o.linkPort()
		return usagef("invalid --%s %d: %s", linkFlag, port, fe.Msg)
	case name == "kubernetes" && sub == "namespace":
		return usagef("invalid --k8s-namespace %q: %s", o.K8sNamespace, fe.Msg)
	case name == "kubernetes" && sub == "image":
		return usagef("invalid --k8s-image %q: %s", o.K8sImage, fe.Msg)
	case name == "kubernetes":
		return usagef("--kubernetes: %s", fe.Msg)
	case name == "console_keys":
		return usagef("--console-keys: %s", fe.Msg)
	case name == "admin_port":
		return usagef("invalid --admin-port %d: %s", o.AdminPort, fe.Msg)
	}
	return usagef("%s: %s", fe.Field, fe.Msg)
}

// linkPort is the base port of the nodes' link to each other: --raft-port
// of a cluster, --peer-port of a pair; flag names it, what is its name in
// messages.
func (o *initOptions) linkPort() (port int, flag, what string) {
	if o.Pair {
		return o.PeerPort, "peer-port", "peer port"
	}
	return o.RaftPort, "raft-port", "Raft port"
}

// checkPorts: the client, link and admin base ports are ports (a Spec
// takes 0 for the default, a flag does not), and differ.
func (o *initOptions) checkPorts() error {
	link, flag, _ := o.linkPort()
	for _, p := range []struct {
		flag string
		port int
	}{{"port", o.Port}, {flag, link}, {"admin-port", o.AdminPort}} {
		if p.port < 1 || p.port > 65535 {
			return usagef("invalid --%s %d: want 1..65535", p.flag, p.port)
		}
	}
	if o.Port == link || o.Port == o.AdminPort || link == o.AdminPort {
		return usagef("--port, --%s and --admin-port must differ", flag)
	}
	return nil
}

// parseNodes splits --node ID=HOST entries (the plan checks IDs and
// hosts); an ID given twice is an error.
func parseNodes(entries []string) ([]deploy.Node, error) {
	var nodes []deploy.Node
	seen := map[string]bool{}
	for _, e := range entries {
		id, host, ok := strings.Cut(e, "=")
		if !ok {
			return nil, usagef("invalid --node %q: want ID=HOST", e)
		}
		if seen[id] {
			return nil, usagef("--node %s is given twice", id)
		}
		seen[id] = true
		nodes = append(nodes, deploy.Node{ID: id, Host: host})
	}
	return nodes, nil
}

func initClusterCmd(cmd *cobra.Command, o *initOptions, stdout io.Writer) error {
	for _, name := range []string{"host", "listen"} {
		if cmd.Flags().Changed(name) {
			return usagef("--%s and --cluster exclude each other: --node ID=HOST names each node's host", name)
		}
	}
	if cmd.Flags().Changed("peer-port") {
		return usagef("--peer-port needs --pair")
	}
	if err := o.checkPorts(); err != nil {
		return err
	}
	spec := deploy.DefaultSpec(deploy.Cluster)
	if o.Add {
		ex, err := deploy.LoadCluster(o.Dir)
		if err != nil {
			return runtimef("--add: %w", err)
		}
		spec.Existing = ex
		// Base ports not given: the bundle's.
		port, raft, admin := ex.BasePorts()
		for _, b := range []struct {
			flag      string
			dst       *int
			fromFiles int
		}{{"port", &o.Port, port}, {"raft-port", &o.RaftPort, raft}, {"admin-port", &o.AdminPort, admin}} {
			if !cmd.Flags().Changed(b.flag) && b.fromFiles != 0 {
				*b.dst = b.fromFiles
			}
		}
	}
	if len(o.Nodes) == 0 {
		return usagef("--cluster needs its nodes: --node ID=HOST, once per node (3 or 5 of them)")
	}
	nodes, err := parseNodes(o.Nodes)
	if err != nil {
		return err
	}
	spec.Dir, spec.Nodes, spec.Port, spec.PeerPort, spec.AdminPort = o.Dir, nodes, o.Port, o.RaftPort, o.AdminPort
	spec.ConsoleKeys = o.ConsoleKeys
	return initWrite(cmd, o, spec, o.Nodes, stdout)
}

func initPairCmd(cmd *cobra.Command, o *initOptions, stdout io.Writer) error {
	for _, name := range []string{"host", "listen"} {
		if cmd.Flags().Changed(name) {
			return usagef("--%s and --pair exclude each other: --node primary=HOST and --node backup=HOST name the nodes' hosts", name)
		}
	}
	for _, name := range []string{"raft-port", "add"} {
		if cmd.Flags().Changed(name) {
			return usagef("--%s needs --cluster", name)
		}
	}
	if err := o.checkPorts(); err != nil {
		return err
	}
	entries, err := pairNodes(o.Nodes)
	if err != nil {
		return err
	}
	nodes, err := parseNodes(entries)
	if err != nil {
		return err
	}
	spec := deploy.DefaultSpec(deploy.Pair)
	spec.Dir, spec.Nodes, spec.Port, spec.PeerPort, spec.AdminPort = o.Dir, nodes, o.Port, o.PeerPort, o.AdminPort
	spec.ConsoleKeys = o.ConsoleKeys
	return initWrite(cmd, o, spec, entries, stdout)
}

// pairNodes checks the --node entries of 'init --pair': primary=HOST and
// backup=HOST, once each (the plan checks the hosts). It returns them
// primary first, so that the primary gets the base ports when the two
// share a host.
func pairNodes(entries []string) ([]string, error) {
	byRole := map[string]string{}
	for _, e := range entries {
		role, _, ok := strings.Cut(e, "=")
		if !ok {
			return nil, usagef("invalid --node %q: want primary=HOST or backup=HOST", e)
		}
		if role != pairRoles[0] && role != pairRoles[1] {
			return nil, usagef("invalid --node %q: the nodes of a pair are primary and backup", e)
		}
		if _, dup := byRole[role]; dup {
			return nil, usagef("--node %s is given twice", role)
		}
		byRole[role] = e
	}
	for _, r := range pairRoles {
		if _, ok := byRole[r]; !ok {
			return nil, usagef("--pair needs its two nodes, --node primary=HOST and --node backup=HOST: %s is missing", r)
		}
	}
	return []string{byRole[pairRoles[0]], byRole[pairRoles[1]]}, nil
}
