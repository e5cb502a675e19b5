package server_test

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ticketing-dev/ticketing/server"
)

// schema describes every metric family a registry gathers: name, type,
// label names, histogram bounds and help text, one line per series, sorted.
func schema(t *testing.T, reg prometheus.Gatherer) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			var labels []string
			for _, lp := range m.Label {
				labels = append(labels, lp.GetName()+"="+lp.GetValue())
			}
			line := fmt.Sprintf("%s %s {%s}", mf.GetName(), strings.ToLower(mf.GetType().String()), strings.Join(labels, ","))
			if mf.GetType() == dto.MetricType_HISTOGRAM {
				var le []string
				for _, b := range m.Histogram.Bucket {
					le = append(le, fmt.Sprint(b.GetUpperBound()))
				}
				line += " le=" + strings.Join(le, ",")
			}
			lines = append(lines, line+" | "+mf.GetHelp())
		}
	}
	sort.Strings(lines)
	return lines
}

// metricsSchema is what the server exposed before its metrics moved onto
// client_golang's own types (a hand-rolled collector until then): names,
// types, labels, bucket bounds and help texts are what operators' dashboards
// and alerts depend on, so they must not change.
var metricsSchema = []string{
	"ticketing_auth_failures_total counter {} | HELLOs with a wrong client token.",
	"ticketing_auth_throttled_total counter {} | HELLOs with a wrong client token closed without a reply (too many recent failures from the address).",
	"ticketing_busy_total counter {} | ACQUIREs answered B (a capacity limit, or no fencing token in time).",
	"ticketing_cancelled_total counter {} | Waiting ACQUIREs removed by a CANCEL (version 2) and answered T (included in timeouts_total).",
	"ticketing_conn_budget gauge {} | The connections the server's listeners may hold open at once (the open-file limit minus the descriptors kept for files); 0: no cap.",
	"ticketing_conn_budget_in_use gauge {} | Connections holding a unit of the connection budget, over every listener.",
	"ticketing_conn_budget_refused_total counter {} | Connections closed at accept, on any listener, because the connection budget was spent.",
	"ticketing_expired_total counter {} | Leases that ran out before a release.",
	"ticketing_grant_wait_seconds histogram {} le=0.001,0.0025,0.005,0.01,0.025,0.05,0.1,0.25,0.5,1,2.5,5,10,30,60,120,255 | Time from reading an ACQUIRE to granting it.",
	"ticketing_grants_total counter {} | Grants with a new token.",
	"ticketing_held_locks gauge {} | Granted, unexpired locks.",
	"ticketing_idle_timeouts_total counter {} | Sessions dropped for sending no frame within the idle timeout while awaiting no reply.",
	"ticketing_kept_total counter {} | EXTENDs answered K (protocol version 3).",
	"ticketing_log_suppressed_total counter {} | Log lines about peers left out by the rate limit (summed up in one line per interval).",
	"ticketing_not_held_total counter {} | RELEASEs and EXTENDs answered N.",
	"ticketing_output_overflows_total counter {} | Sessions dropped because their peer did not read.",
	"ticketing_peer_session_limit_total counter {} | HELLOs refused with E(7) by the per-peer session limit.",
	"ticketing_pending_conns gauge {} | Connections that have not completed HELLO.",
	"ticketing_pending_refused_total counter {} | Connections closed at accept: too many connections before HELLO.",
	"ticketing_protocol_errors_total counter {code=1} | E frames sent for protocol violations and internal errors, by code.",
	"ticketing_protocol_errors_total counter {code=2} | E frames sent for protocol violations and internal errors, by code.",
	"ticketing_protocol_errors_total counter {code=3} | E frames sent for protocol violations and internal errors, by code.",
	"ticketing_protocol_errors_total counter {code=4} | E frames sent for protocol violations and internal errors, by code.",
	"ticketing_protocol_errors_total counter {code=6} | E frames sent for protocol violations and internal errors, by code.",
	"ticketing_protocol_errors_total counter {code=7} | E frames sent for protocol violations and internal errors, by code.",
	"ticketing_released_total counter {} | RELEASEs answered R.",
	"ticketing_role gauge {} | The node's role: 0 standby (not serving), 1 standalone, 2 active of a pair, 3 cluster leader.",
	"ticketing_sessions gauge {} | Open sessions (HELLO completed).",
	"ticketing_timeouts_total counter {} | ACQUIREs answered T.",
	"ticketing_token_ceiling gauge {} | Durable token ceiling.",
	"ticketing_token_last gauge {} | Highest fencing token handed out.",
	"ticketing_token_store_ok gauge {} | 1 while the token store can reserve tokens, 0 while its last reservation failed, one has been running for over a second, or the token space is exhausted.",
	"ticketing_token_unavailable_total counter {} | ACQUIREs answered B because no fencing token could be reserved in time (stalled disk, exhausted token space).",
	"ticketing_waiters gauge {} | ACQUIREs waiting in a queue.",
}

func TestMetricsSchema(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	startServer(t, server.Config{Registerer: reg})
	got := schema(t, reg)
	if strings.Join(got, "\n") != strings.Join(metricsSchema, "\n") {
		t.Errorf("metrics schema changed:\ngot:\n\t%s\nwant:\n\t%s", strings.Join(got, "\n\t"), strings.Join(metricsSchema, "\n\t"))
	}
}
