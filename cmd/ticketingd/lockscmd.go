package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/server/admin"
)

// 'ticketingd locks': the lock browser of a node's admin listener
// (--console-keys) on the command line.

type locksListOptions struct {
	Prefix, After, AfterB64 string
	Limit                   int
}

func newLocksCmd(stdout, stderr io.Writer) *cobra.Command {
	var o clusterCmdOptions
	cmd := &cobra.Command{
		Use:   "locks list|show|expire --admin HOST:PORT",
		Short: "List held locks, show one with its waiters, or expire one now, through a node's admin listener",
		Long: `Browse the held locks through the admin listener (--admin-listen) of a
node started with --console-keys and --admin-token:

  ticketingd locks list [--prefix P] [--after K] [--limit N] --admin HOST:PORT
                                  held locks sorted by key: token, holder, lease left, waiters
  ticketingd locks show KEY --admin HOST:PORT
                                  one lock and its waiters, in the order they will be granted
  ticketingd locks expire KEY --token N --admin HOST:PORT
                                  end KEY's lease now if it is held with token N (asks first)

On a cluster, ask the leader (a follower lists the holdings it has
applied, without lease ends, waiters or holders, and refuses expire,
naming the leader); on a pair, the active. With several --admin addresses
(A,B,C), every command asks them in turn until one serves (the leader,
the active); if none does, list and show print the first answer, the
holdings as that node applied them, with a note. The admin token is --admin-token, or else the
environment variable ` + adminTokenEnv + `.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return usagef("missing locks command (list, show or expire)")
		},
	}
	o.addFlags(cmd, "until one serves (the leader, the active)")

	var lo locksListOptions
	list := &cobra.Command{
		Use:   "list --admin HOST:PORT",
		Short: "List held locks sorted by key: token, holder, lease left, waiters",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if lo.Limit < 1 || lo.Limit > server.MaxLockPage {
				return usagef("invalid --limit %d: want 1 to %d", lo.Limit, server.MaxLockPage)
			}
			if lo.After != "" && lo.AfterB64 != "" {
				return usagef("give --after or --after-b64, not both")
			}
			if err := o.check(); err != nil {
				return err
			}
			return locksList(cmd.Context(), &o, &lo, stdout, stderr)
		},
	}
	list.Flags().StringVar(&lo.Prefix, "prefix", "", "only keys that start with `P`")
	list.Flags().StringVar(&lo.After, "after", "", "only keys after `KEY` (the last key of the previous page)")
	list.Flags().StringVar(&lo.AfterB64, "after-b64", "", "--after as base64 (for a key that is not printable text; a page says which to give)")
	list.Flags().IntVar(&lo.Limit, "limit", server.DefaultLockPage, fmt.Sprintf("at most `N` locks (1 to %d)", server.MaxLockPage))

	show := &cobra.Command{
		Use:   "show KEY --admin HOST:PORT",
		Short: "Show one held lock and its waiters, in the order they will be granted",
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("locks show takes one argument, the key; got %d", len(args))
			}
			if err := o.check(); err != nil {
				return err
			}
			return locksShow(cmd.Context(), &o, args[0], stdout, stderr)
		},
	}

	var token uint64
	var yes bool
	var op string
	expire := &cobra.Command{
		Use:   "expire KEY --token N --admin HOST:PORT",
		Short: "End KEY's lease now if it is held with token N: its next waiter is granted with a higher token",
		Long: `End KEY's lease now, exactly as if it had run out, if KEY is held with
token N (see 'ticketingd locks show KEY'): the oldest waiter is granted
with a new, higher token, and the old holder's writes fenced with token N
are rejected by the databases that check fencing tokens once the new
holder has written the resource (until then they are still accepted);
its RELEASE gets N (not held). For a stuck lock whose holder is gone or hung, when waiting
for its lease is not an option. The command shows the lock and asks for
confirmation unless --yes is given; the node logs who asked (--operator).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("locks expire takes one argument, the key; got %d", len(args))
			}
			if token == 0 {
				return usagef("--token is required: the exact token KEY is held with (see 'ticketingd locks show')")
			}
			if err := o.check(); err != nil {
				return err
			}
			if op == "" {
				op = whoAmI()
			}
			return locksExpire(cmd.Context(), &o, args[0], token, op, yes, cmd.InOrStdin(), stdout, stderr)
		},
	}
	expire.Flags().Uint64Var(&token, "token", 0, "the exact fencing `token` the key is held with")
	expire.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation")
	expire.Flags().StringVar(&op, "operator", "", "who asks, for the node's log (X-Ticketing-Operator; default the user name)")
	cmd.AddCommand(list, show, expire)
	return cmd
}

// whoAmI is the user running the command, for the node's log.
func whoAmI() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return os.Getenv("USER")
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// lockAnswer decodes a lock-browser answer into v, or makes its error.
func lockAnswer(o *clusterCmdOptions, what string, code int, body []byte, v any) error {
	if code == http.StatusOK {
		if err := json.Unmarshal(body, v); err != nil {
			return runtimef("admin listener %s: %s: %w", o.Admin, what, err)
		}
		return nil
	}
	var e admin.MisdirectedResponse
	if json.Unmarshal(body, &e) != nil || e.Error == "" {
		if code == http.StatusNotFound || code == http.StatusMethodNotAllowed {
			return runtimef("the node at %s has no lock browser (a ticketingd without /v1/locks)", o.Admin)
		}
		return runtimef("admin listener %s: %s: %s", o.Admin, http.StatusText(code), strings.TrimSpace(string(body)))
	}
	switch {
	case code == http.StatusMisdirectedRequest && e.Leader != "":
		return runtimef("the node at %s is not the leader: the leader is %s (clients %s, Raft %s): repeat the command against its admin listener",
			o.Admin, e.Leader, orUnknown(e.LeaderAdvertise), orUnknown(e.LeaderAddress))
	case code == http.StatusMisdirectedRequest && e.Active != "":
		return runtimef("the node at %s is the pair's passive: the active is at %s (clients): repeat the command against its admin listener", o.Admin, e.Active)
	case code == http.StatusNotFound && strings.HasPrefix(e.Error, "the lock browser is off"):
		return runtimef("%s: %s; in a config written by 'ticketingd init', uncomment the line '# console-keys: true' "+
			"(on every node of a cluster or pair), then restart the node: the setting is read at start", o.Admin, e.Error)
	case code == http.StatusNotFound, code == http.StatusConflict, code == http.StatusForbidden, code == http.StatusMisdirectedRequest:
		return runtimef("%s: %s", o.Admin, e.Error)
	}
	return adminError(o, code, e.Error)
}

func locksList(ctx context.Context, o *clusterCmdOptions, lo *locksListOptions, stdout, stderr io.Writer) error {
	q := url.Values{"limit": {strconv.Itoa(lo.Limit)}}
	if lo.Prefix != "" {
		q.Set("prefix", lo.Prefix)
	}
	if lo.After != "" {
		q.Set("after", lo.After)
	}
	if lo.AfterB64 != "" {
		q.Set("after_b64", lo.AfterB64)
	}
	r, fellBack, err := fromServing(o, func(resp *admin.LocksResponse) (bool, error) {
		code, body, err := adminCall(ctx, o, http.MethodGet, "/v1/locks?"+q.Encode(), nil)
		if err != nil {
			return false, err
		}
		if err := lockAnswer(o, "/v1/locks", code, body, resp); err != nil {
			return false, err
		}
		return servingView(resp.View), nil
	})
	if err != nil {
		return err
	}
	resp := *r
	if fellBack {
		noServingNote(o, stderr)
	}
	if o.JSON {
		return printJSON(stdout, resp)
	}
	fmt.Fprintf(stdout, "%d held locks on this page (view %s)\n", len(resp.Locks), resp.View)
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "KEY\tTOKEN\tHOLDER\tLEASE LEFT\tLEASE\tWAITERS\t\n")
	for _, l := range resp.Locks {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%ds\t%d\t\n", showKey(l.Key, l.KeyB64), l.Token, showSession(l.Holder), leaseLeft(&l), l.LeaseS, l.Waiters)
	}
	_ = tw.Flush()
	for line := range strings.Lines(b.String()) {
		fmt.Fprintln(stdout, strings.TrimRight(line, " \n"))
	}
	if resp.More {
		if plainArg(resp.Next) {
			fmt.Fprintf(stdout, "more: the next page is --after %s\n", resp.Next)
		} else {
			fmt.Fprintf(stdout, "more: the next page is --after-b64 %s\n", resp.NextB64)
		}
	}
	if resp.View == server.ViewFollowerApplied || resp.View == server.ViewPassiveApplied {
		fmt.Fprintf(stdout, "this node does not serve: the holdings as it applied them; lease left, waiters and holders are the serving node's (ask the leader or the active)\n")
	}
	return nil
}

func locksShow(ctx context.Context, o *clusterCmdOptions, key string, stdout, stderr io.Writer) error {
	resp, err := getServingLock(ctx, o, key, stderr)
	if err != nil {
		return err
	}
	if o.JSON {
		return printJSON(stdout, resp)
	}
	printLock(stdout, resp)
	return nil
}

// getServingLock is key's lock as the serving node among the --admin
// nodes knows it (fromServing), or else as the first node that answers,
// with a note on stderr.
func getServingLock(ctx context.Context, o *clusterCmdOptions, key string, stderr io.Writer) (*admin.LockResponse, error) {
	resp, fellBack, err := fromServing(o, func(l *admin.LockResponse) (bool, error) {
		if err := getLock(ctx, o, key, l); err != nil {
			return false, err
		}
		return servingView(l.View), nil
	})
	if err == nil && fellBack {
		noServingNote(o, stderr)
	}
	return resp, err
}

// servingView reports whether a lock-browser answer of this view comes
// from the node that serves (not a follower's or a passive's applied
// state, without holders, lease left or waiters).
func servingView(view string) bool {
	return view != server.ViewFollowerApplied && view != server.ViewPassiveApplied
}

// noServingNote says, on stderr, that none of the --admin nodes serves and
// whose view is shown instead.
func noServingNote(o *clusterCmdOptions, stderr io.Writer) {
	fmt.Fprintf(stderr, "note: none of the --admin nodes serves (neither a cluster's leader nor a pair's active answered): "+
		"this is %s's applied state; give the serving node's admin address to see holders, lease left and waiters\n", o.Admin)
}

func getLock(ctx context.Context, o *clusterCmdOptions, key string, resp *admin.LockResponse) error {
	code, body, err := adminCall(ctx, o, http.MethodGet, admin.LockPath(key), nil)
	if err != nil {
		return err
	}
	return lockAnswer(o, "/v1/locks/{key}", code, body, resp)
}

func printLock(w io.Writer, l *admin.LockResponse) {
	fmt.Fprintf(w, "key %s (view %s)\n", showKey(l.Key, l.KeyB64), l.View)
	owned := ""
	if l.OwnedOnly {
		owned = ", owned-only (RELEASE_OWNED)"
	}
	fmt.Fprintf(w, "token %d, owner %s, lease %ds, lease left %s%s\n", l.Token, l.Owner, l.LeaseS, leaseLeft(&l.Lock), owned)
	fmt.Fprintf(w, "holder %s\n", showSession(l.Holder))
	if len(l.Queue) == 0 {
		fmt.Fprintf(w, "no waiters\n")
		return
	}
	if len(l.Queue) == 1 {
		fmt.Fprintf(w, "1 waiter:\n")
	} else {
		fmt.Fprintf(w, "%d waiters, in the order they will be granted:\n", len(l.Queue))
	}
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "#\tSESSION\tOWNER\tLEASE\tWAITED\tWAIT LEFT\t\n")
	for i, q := range l.Queue {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%ds\t%s\t%s\t\n", i+1, showSession(q.Session), q.Owner, q.LeaseS, msDuration(q.WaitedMS), msDuration(q.WaitLeftMS))
	}
	_ = tw.Flush()
	for line := range strings.Lines(b.String()) {
		fmt.Fprintln(w, strings.TrimRight(line, " \n"))
	}
}

// locksExpire shows the lock and asks (unless yes), then posts the expire
// to the --admin nodes in turn until one serves.
func locksExpire(ctx context.Context, o *clusterCmdOptions, key string, token uint64, op string, yes bool, stdin io.Reader, stdout, stderr io.Writer) error {
	if !yes {
		l, err := getServingLock(ctx, o, key, stderr)
		if err != nil {
			return err
		}
		printLock(stderr, l)
		if l.Token != token {
			return runtimef("%s is held with token %d, not %d: it changed hands; nothing expired", showKey(l.Key, l.KeyB64), l.Token, token)
		}
		fmt.Fprintf(stderr, "Expire it now? The next waiter gets a new token; the holder's writes fenced with token %d are rejected once the new holder has written. [y/N] ", token)
		line, _ := bufio.NewReader(stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
			return runtimef("not confirmed: nothing expired (give --yes to skip the question)")
		}
	}
	var resp admin.ExpireResponse
	err := o.untilServing(func() (bool, error) {
		code, body, err := adminCallOp(ctx, o, http.MethodPost, admin.LockPath(key)+"/expire", admin.ExpireRequest{Token: admin.TokenValue(token)}, op)
		if err != nil {
			return ctx.Err() == nil, err
		}
		return code == http.StatusMisdirectedRequest, lockAnswer(o, "expire", code, body, &resp)
	})
	if err != nil {
		return err
	}
	if o.JSON {
		return printJSON(stdout, resp)
	}
	fmt.Fprintf(stdout, "expired %s (token %d)\n", showKey(resp.Key, resp.KeyB64), token)
	if resp.Now != nil {
		fmt.Fprintf(stdout, "now held by %s with token %d\n", showSession(resp.Now.Holder), resp.Now.Token)
	} else {
		fmt.Fprintf(stdout, "the key is free\n")
	}
	return nil
}

// adminCallOp is adminCall naming the operator (admin.OperatorHeader).
func adminCallOp(ctx context.Context, o *clusterCmdOptions, method, path string, reqBody any, op string) (int, []byte, error) {
	return adminCallHeader(ctx, o, method, path, reqBody, http.Header{admin.OperatorHeader: {op}})
}

// showKey is a key for a terminal: itself if it is printable text
// without blanks, else quoted (Go syntax), or its base64 if it is not
// UTF-8.
func showKey(key, b64 string) string {
	if key == "" && b64 != "" {
		if k, err := base64.StdEncoding.DecodeString(b64); err == nil {
			return strconv.Quote(string(k))
		}
		return "base64:" + b64
	}
	if printable(key) && !strings.ContainsFunc(key, unicode.IsSpace) {
		return key
	}
	return strconv.Quote(key)
}

// plainArg reports whether s is a shell word as it is: not empty, ASCII
// letters, digits and "/._-:@+,=" only.
func plainArg(s string) bool {
	return s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("/._-:@+,=", r))
	})
}

func printable(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) && r != ' ' })
}

func showSession(s *admin.Session) string {
	switch {
	case s == nil:
		return "-"
	case s.Name == "":
		return s.Addr
	}
	return s.Name + "@" + s.Addr
}

func leaseLeft(l *admin.Lock) string {
	if l.LeaseLeftMS == nil {
		return "-"
	}
	return msDuration(*l.LeaseLeftMS)
}

// fromServing runs get against the --admin nodes in turn (o.Admin), each
// time into a new T, until a node that serves answers (the cluster's
// leader, the pair's active: get reports whether it does), and returns
// that answer. A node that does not serve (a follower, a passive) knows
// less: the first such answer is kept, and returned with fellBack true
// (o.Admin is its node) if none of the nodes serves. A node that does not
// answer, or answers with an error, is skipped; if none answers, the last
// error is returned. It is untilServing for reads: the same order, the
// same nodes.
func fromServing[T any](o *clusterCmdOptions, get func(v *T) (serving bool, err error)) (v *T, fellBack bool, err error) {
	var first *T
	firstAt := ""
	err = o.untilServing(func() (bool, error) {
		w := new(T)
		serving, err := get(w)
		switch {
		case err != nil:
			return true, err
		case serving:
			v = w
			return false, nil
		}
		if first == nil {
			first, firstAt = w, o.Admin
		}
		return true, nil
	})
	switch {
	case v != nil:
		return v, false, nil
	case first != nil:
		o.Admin = firstAt
		return first, true, nil
	}
	return nil, false, err
}

// untilServing runs f against the --admin nodes in turn (o.Admin) while it
// asks to retry (the node was unreachable, or does not serve); any other
// outcome ends it: a change whose outcome is unknown must not be made
// twice.
func (o *clusterCmdOptions) untilServing(f func() (retry bool, err error)) error {
	var err error
	for _, a := range o.Admins {
		o.Admin = a
		var retry bool
		if retry, err = f(); !retry {
			return err
		}
	}
	return err
}
