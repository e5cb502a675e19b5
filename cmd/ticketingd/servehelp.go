package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// flagGroupAnnotation is the pflag annotation that names a serve flag's
// group in 'ticketingd serve --help'.
const flagGroupAnnotation = "ticketingd/group"

// serveFlagGroups are the headings of 'ticketingd serve --help', in order,
// with their flags in order. Every flag of serve is in exactly one group
// (TestServeFlagGroups): a new setting needs a line here.
var serveFlagGroups = []struct {
	title string
	flags []string
}{
	{"Configuration", []string{"config"}},
	{"Listening", []string{"listen", "node-name", "standby", "standby-hint"}},
	{"Tokens and data", []string{"data-dir", "client-token", "client-tokens-file", "token-start", "initial-token", "token-block", "owned-release-only"}},
	{"TLS", []string{"tls-cert", "tls-key", "tls-client-ca"}},
	{"Limits and timeouts", []string{"max-locks", "max-waiters", "max-key-waiters", "max-sessions", "max-sessions-per-peer", "max-pending-conns", "conn-budget", "fd-reserve",
		"idle-timeout", "socket-buffer", "write-timeout", "shutdown-timeout"}},
	{"Admin and console", []string{"admin-listen", "admin-token", "console-keys", "admin-max-conns", "admin-max-conns-per-source",
		"admin-header-timeout", "admin-allowed-host"}},
	{"Cluster (Raft)", []string{"cluster", "node-id", "raft-listen", "raft-advertise", "peers", "initial-cluster-state", "cluster-id",
		"raft-heartbeat", "raft-election", "max-session-proposals", "max-proposals", "early-release", "committed-release"}},
	{"Pair (hot standby)", []string{"pair", "pair-id", "peer", "peer-listen", "peer-plaintext", "heartbeat", "peer-max-conns", "peer-max-conns-per-source"}},
	{"Cluster and pair", []string{"advertise", "peer-tls-cert", "peer-tls-key", "peer-tls-ca"}},
	{"Logging", []string{"log-level", "log-format"}},
}

// groupServeFlags annotates serve's flags with their groups and makes
// its usage list them under their headings. It panics on a group's flag
// that serve does not have.
func groupServeFlags(cmd *cobra.Command) {
	fs := cmd.Flags()
	for _, g := range serveFlagGroups {
		for _, name := range g.flags {
			if fs.Lookup(name) == nil {
				panic(fmt.Sprintf("serve flag group %q: no flag --%s", g.title, name))
			}
			if err := fs.SetAnnotation(name, flagGroupAnnotation, []string{g.title}); err != nil {
				panic(err)
			}
		}
	}
	cmd.SetUsageFunc(func(c *cobra.Command) error {
		var b strings.Builder
		fmt.Fprintf(&b, "Usage:\n  %s\n", c.UseLine())
		seen := map[string]bool{}
		for _, g := range serveFlagGroups {
			set := pflag.NewFlagSet(g.title, pflag.ContinueOnError)
			set.SortFlags = false
			for _, name := range g.flags {
				set.AddFlag(c.Flags().Lookup(name))
				seen[name] = true
			}
			fmt.Fprintf(&b, "\n%s:\n%s", g.title, set.FlagUsages())
		}
		// The rest: cobra's own (--help), added after the groups were set.
		other := pflag.NewFlagSet("other", pflag.ContinueOnError)
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if !seen[f.Name] {
				other.AddFlag(f)
			}
		})
		if other.HasFlags() {
			fmt.Fprintf(&b, "\nOther:\n%s", other.FlagUsages())
		}
		_, err := fmt.Fprint(c.OutOrStderr(), b.String())
		return err
	})
}
