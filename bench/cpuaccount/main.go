// Command cpuaccount turns the text of `perf script -F
// comm,pid,tid,time,event,ip,sym,dso` (a system-wide
// `perf record -a -g` taken while a benchmark runs) into an account of
// where the CPU went: per process (named with -role) and per kind of
// work, as a share of the samples or, given the cycles the benchmark made
// in the recorded window, as microseconds of CPU per cycle. bench/account.sh
// runs it; see there.
//
// A sample's kind comes from its stack. A kernel sample is fsync
// (fdatasync/fsync and what the disk does for it), file write, network
// (TCP, sockets, softirq receive), scheduling (context switches, futex,
// nanosleep, epoll) or other kernel. A user sample is Go runtime
// (scheduler, sysmon, ...), alloc+GC, or the owner of the nearest frame
// that is not the standard library: raft (this module's Raft, a copy of
// hashicorp/raft, with its log store and transport; hashicorp's codec), server (the server
// package and the lock core), wire codec (internal/wire, in the server
// or the client) or client (the broker, the load tool). Idle (the swapper's halt) is counted apart.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

type roleFlag map[string]string // pid -> role

func (r roleFlag) String() string { return fmt.Sprint(map[string]string(r)) }

func (r roleFlag) Set(v string) error {
	pid, name, ok := strings.Cut(v, "=")
	if !ok || pid == "" || name == "" {
		return fmt.Errorf("want PID=NAME, got %q", v)
	}
	r[pid] = name
	return nil
}

// Kinds, in the order they are printed.
var kinds = []string{
	"client", "server", "wire codec", "raft", "Go runtime", "alloc+GC", "other user",
	"kernel: fsync", "kernel: file write", "kernel: network", "kernel: scheduling", "kernel: other",
}

func main() {
	roles := roleFlag{}
	flag.Var(roles, "role", "`PID=NAME`: name a process (repeat); other processes are grouped by command name (kernel workers as kworker)")
	hz := flag.Float64("hz", 0, "perf record's sampling frequency (-F); with -cycles, prints µs of CPU per cycle")
	cycles := flag.Float64("cycles", 0, "cycles the benchmark made in the recorded window")
	flag.Parse()
	if err := run(os.Stdin, os.Stdout, roles, *hz, *cycles); err != nil {
		fmt.Fprintln(os.Stderr, "cpuaccount:", err)
		os.Exit(1)
	}
}

type account struct {
	n     map[string]map[string]int // role -> kind -> samples
	order []string                  // roles, in the order first seen
	total int
	idle  int
}

func run(in io.Reader, out io.Writer, roles map[string]string, hz, cycles float64) error {
	a := &account{n: map[string]map[string]int{}}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var head string
	var stack []string
	flush := func() {
		if head != "" {
			a.add(roles, head, stack)
		}
		head, stack = "", stack[:0]
	}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			flush()
		case line[0] == '\t' || line[0] == ' ':
			if head != "" {
				stack = append(stack, strings.TrimSpace(line))
			}
		default:
			flush()
			head = line
		}
	}
	flush()
	if err := sc.Err(); err != nil {
		return err
	}
	if a.total == 0 {
		return fmt.Errorf("no samples in the input (the text of perf script -F comm,pid,tid,time,event,ip,sym,dso)")
	}
	a.print(out, hz, cycles)
	return nil
}

// add counts one sample: head is its header line (comm pid [cpu] time:
// ...), stack its frames, leaf first ("addr sym+off (dso)").
func (a *account) add(roles map[string]string, head string, stack []string) {
	f := strings.Fields(head)
	if len(f) < 2 {
		return
	}
	// "comm pid/tid ...": the command name may contain spaces; the pid
	// is the first field of the form pid/tid.
	comm, pid := f[0], ""
	for i := 1; i < len(f); i++ {
		if p, tid, ok := strings.Cut(f[i], "/"); ok && isNumber(p) && isNumber(tid) {
			comm, pid = strings.Join(f[:i], " "), p
			break
		}
	}
	if pid == "" {
		return
	}
	a.total++
	if pid == "0" {
		a.idle++
		return
	}
	role, ok := roles[pid]
	if !ok {
		role = comm
		if strings.HasPrefix(comm, "kworker") {
			role = "kworker"
		}
	}
	m := a.n[role]
	if m == nil {
		m = map[string]int{}
		a.n[role] = m
		a.order = append(a.order, role)
	}
	m[kindOf(stack)]++
}

func isNumber(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}

// sym is the function name of a frame line.
func sym(frame string) string {
	_, rest, ok := strings.Cut(frame, " ")
	if !ok {
		return frame
	}
	if i := strings.LastIndex(rest, " ("); i >= 0 {
		rest = rest[:i]
	}
	if i := strings.LastIndex(rest, "+0x"); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

func kernelFrame(frame string) bool { return strings.HasSuffix(frame, "([kernel.kallsyms])") }

func kindOf(stack []string) string {
	if len(stack) == 0 {
		return "kernel: other"
	}
	if kernelFrame(stack[0]) {
		return kernelKind(stack)
	}
	if runtimeFrame(sym(stack[0])) {
		for _, fr := range stack {
			s := sym(fr)
			if strings.HasPrefix(s, "runtime.mallocgc") || strings.HasPrefix(s, "runtime.gc") || strings.HasPrefix(s, "runtime.scanobject") || strings.HasPrefix(s, "runtime.growslice") || strings.HasPrefix(s, "runtime.newobject") || strings.HasPrefix(s, "runtime.makeslice") || strings.HasPrefix(s, "runtime.bgsweep") || strings.HasPrefix(s, "runtime.(*mheap)") {
				return "alloc+GC"
			}
			if !runtimeFrame(s) {
				// A map or a copy in someone's code: its owner's.
				if k := owner(stack); k != "" {
					return k
				}
				break
			}
		}
		return "Go runtime"
	}
	if k := owner(stack); k != "" {
		return k
	}
	return "other user"
}

// runtimeFrame reports whether s is a function of the Go runtime (or one
// of its assembly helpers for maps and strings).
func runtimeFrame(s string) bool {
	return strings.HasPrefix(s, "runtime.") || strings.HasPrefix(s, "internal/runtime/") ||
		strings.HasPrefix(s, "aeshash") || strings.HasPrefix(s, "memeqbody")
}

// owner is the kind of the nearest frame of a known module.
func owner(stack []string) string {
	for _, fr := range stack {
		s := sym(fr)
		switch {
		case strings.Contains(s, "hashicorp/") || strings.Contains(s, "armon/go-metrics") ||
			strings.Contains(s, "ticketing/internal/raft"): // raft, raftlog, raftnet, raftstore
			return "raft"
		case strings.Contains(s, "ticketing/internal/wire"):
			return "wire codec"
		case strings.Contains(s, "ticketing/server"):
			return "server"
		case strings.Contains(s, "ticketing/broker") || strings.HasPrefix(s, "main.") || strings.Contains(s, "ticketing/internal/benchkit"):
			return "client"
		}
	}
	return ""
}

func kernelKind(stack []string) string {
	has := func(names ...string) bool {
		for _, fr := range stack {
			if !kernelFrame(fr) {
				return false
			}
			s := sym(fr)
			for _, n := range names {
				if strings.HasPrefix(s, n) {
					return true
				}
			}
		}
		return false
	}
	switch {
	case has("__x64_sys_fdatasync", "__x64_sys_fsync", "__x64_sys_sync_file_range"):
		return "kernel: fsync"
	case has("tcp_", "sock_", "__sys_recvfrom", "__sys_sendto", "net_rx_action", "__netif_", "ip_", "inet_"):
		return "kernel: network"
	case has("__x64_sys_futex", "__x64_sys_nanosleep", "__x64_sys_epoll", "__x64_sys_sched_yield", "schedule", "__schedule", "finish_task_switch", "try_to_wake_up", "__x64_sys_clock_nanosleep"):
		return "kernel: scheduling"
	case has("__x64_sys_pwrite64", "__x64_sys_write", "ext4_", "blk_", "virtio_queue_rq"):
		return "kernel: file write"
	}
	return "kernel: other"
}

func (a *account) print(out io.Writer, hz, cycles float64) {
	roles := slices.Clone(a.order)
	// The busiest first.
	sum := func(r string) int {
		t := 0
		for _, v := range a.n[r] {
			t += v
		}
		return t
	}
	slices.SortStableFunc(roles, func(x, y string) int { return sum(y) - sum(x) })
	// Roles with under 0.5% of the samples are grouped.
	var shown []string
	other := map[string]int{}
	for _, r := range roles {
		if float64(sum(r)) >= 0.005*float64(a.total) {
			shown = append(shown, r)
			continue
		}
		for k, v := range a.n[r] {
			other[k] += v
		}
	}
	cols := shown
	if len(other) > 0 {
		a.n["(others)"] = other
		cols = append(cols, "(others)")
	}
	perCycle := hz > 0 && cycles > 0
	val := func(n int) string {
		if perCycle {
			return fmt.Sprintf("%.2f", float64(n)/hz/cycles*1e6)
		}
		return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(a.total))
	}
	unit := "share of all samples"
	if perCycle {
		unit = "µs of CPU per cycle"
	}
	fmt.Fprintf(out, "%d samples (%s; idle %s)\n\n", a.total, unit, val(a.idle))
	fmt.Fprintf(out, "| kind | %s | all |\n|---|%s---|\n", strings.Join(cols, " | "), strings.Repeat("---|", len(cols)))
	colTotal := make([]int, len(cols))
	for _, k := range kinds {
		row, t := make([]string, len(cols)), 0
		for i, r := range cols {
			v := a.n[r][k]
			row[i] = val(v)
			t += v
			colTotal[i] += v
		}
		if t == 0 {
			continue
		}
		fmt.Fprintf(out, "| %s | %s | %s |\n", k, strings.Join(row, " | "), val(t))
	}
	row, t := make([]string, len(cols)), 0
	for i, v := range colTotal {
		row[i] = val(v)
		t += v
	}
	fmt.Fprintf(out, "| **all** | %s | %s |\n", strings.Join(row, " | "), val(t))
}
