package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// Exit codes.
const (
	exitOK      = 0
	exitRuntime = 1
	exitUsage   = 2
)

// usageError marks an error as the user's: a bad flag, argument or config
// file content. run exits 2 for it.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// runtimeError marks an error as the environment's: exit 1. Errors that are
// neither (cobra's own: unknown command, unknown flag) are usage errors.
type runtimeError struct{ err error }

func (e *runtimeError) Error() string { return e.err.Error() }
func (e *runtimeError) Unwrap() error { return e.err }

func runtimef(format string, args ...any) error {
	return &runtimeError{fmt.Errorf(format, args...)}
}

// run is the whole program minus process concerns: it parses args, runs the
// subcommand until it finishes or ctx is cancelled (which means SIGTERM or
// SIGINT for serve), and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "ticketingd: %v\n", err)
	var re *runtimeError
	if errors.As(err, &re) {
		return exitRuntime
	}
	if cmd == nil {
		cmd = root
	}
	fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	return exitUsage
}

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "ticketingd",
		Short: "Ticketing lock server: fenced distributed locks over a small TCP protocol",
		Long: `ticketingd is the Ticketing lock server. It grants leases on keys with
fencing tokens that strictly increase across restarts.

Start with 'ticketingd init --dir DIR' to write a deployment, then
'ticketingd serve --config DIR/ticketingd.yaml'.`,
		SilenceUsage:      true,
		SilenceErrors:     true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		RunE: func(cmd *cobra.Command, args []string) error {
			cmd.SetOut(stderr)
			_ = cmd.Help()
			return usagef("missing command (serve, init, cluster, locks, console or version)")
		},
	}
	// --version prints what 'ticketingd version' prints.
	root.Version = readBuildInfo().Version
	root.SetVersionTemplate(strings.ReplaceAll(readBuildInfo().String(), "{{", "{{`{{`}}"))
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return &usageError{err}
	})
	root.AddCommand(newServeCmd(stderr), newInitCmd(stdout), newClusterCmd(stdout, stderr), newLocksCmd(stdout, stderr), newPairCmd(stdout), newConsoleCmd(stderr), newVersionCmd(stdout))
	return root
}

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q", cmd.CommandPath(), args)
	}
	return nil
}

func newVersionCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the module version, VCS revision, whether the tree was modified, and the Go version",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Fprint(stdout, readBuildInfo())
			return nil
		},
	}
}
