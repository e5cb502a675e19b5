package integration_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/integration/harness"
	"github.com/ticketing-dev/ticketing/internal/browsertest"
)

// TestBrowserConsoleClusterFailover opens, in headless chromium, the
// console of each node of a three-node cluster of real ticketingd
// processes (on their admin listeners), sees the leader's console show
// the three members up and a broker's lock, kills the leader with
// SIGKILL, and sees the new leader's console mark the old leader dead
// (unreachable) and name itself leader, and the other survivor's console
// name the new leader.
func TestBrowserConsoleClusterFailover(t *testing.T) {
	tab := browsertest.New(t)
	c := harness.StartCluster(t, harness.Ticketingd(t), harness.ClusterOptions{})
	old := c.WaitConverged(t, hangGuard)

	tabs := map[string]context.Context{}
	for i, n := range c.Nodes {
		nt := tab
		if i > 0 {
			nt = browsertest.NewTab(t, tab)
		}
		tabs[n.ID] = nt
		browsertest.Do(t, nt, chromedp.Navigate("http://"+n.Admin+"/"))
	}

	b := newBroker(t, broker.Config{Addrs: c.Addrs(), Name: "console-test"})
	ctx, cancel := context.WithTimeout(t.Context(), hangGuard)
	defer cancel()
	tk, err := b.Acquire(ctx, "console/key", 0, time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}

	const describe = `[...document.querySelectorAll("#members tbody tr")].map(r => r.textContent.replace(/\s+/g, " ")).join(" | ") +
		"; leader " + document.querySelector('[data-k="cl_leader"]').textContent + "; " + document.getElementById("conn").textContent`
	member := func(id, health string) string {
		return fmt.Sprintf(`document.querySelector('#members tr[data-member=%q][data-health=%q]') !== null`, id, health)
	}
	leaderIs := func(id string) string {
		return fmt.Sprintf(`document.querySelector('[data-k="cl_leader"]').textContent === %q`, id)
	}
	all := leaderIs(old.ID) + fmt.Sprintf(` && document.querySelector('[data-k="held_locks"]').textContent === "1" && document.querySelector('[data-k="last_token"]').textContent === %q`,
		fmt.Sprint(tk.Token()))
	for _, n := range c.Nodes {
		all += " && " + member(n.ID, "up")
	}
	browsertest.WaitJS(t, tabs[old.ID], all, describe, hangGuard)
	browsertest.Screenshot(t, tabs[old.ID], "console-cluster.png")

	old.Kill9()
	var survivors []*harness.ClusterNode
	for _, n := range c.Nodes {
		if n != old {
			survivors = append(survivors, n)
		}
	}
	nl := c.WaitLeader(t, hangGuard)
	if nl == old {
		t.Fatalf("the killed leader %s is still the leader", old.ID)
	}
	t.Logf("killed leader %s; new leader %s", old.ID, nl.ID)
	browsertest.WaitJS(t, tabs[nl.ID], leaderIs(nl.ID)+" && "+member(old.ID, "unreachable")+" && "+member(nl.ID, "up")+
		` && document.querySelector('#members tr[data-member="`+old.ID+`"]').textContent.includes("dead / unreachable")`,
		describe, hangGuard)
	browsertest.Screenshot(t, tabs[nl.ID], "console-cluster-failover.png")
	for _, n := range survivors {
		if n != nl {
			browsertest.WaitJS(t, tabs[n.ID], leaderIs(nl.ID), describe, hangGuard)
		}
	}
}
