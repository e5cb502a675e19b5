package main

import (
	"strings"
	"testing"
)

// Three samples of perf script's text: a node's fdatasync, the load
// tool's own code, a runtime map lookup in the server, and an idle CPU.
const sample = `ticketingd  100/104    10.000001: cpu-clock:ppp: 
	ffffffff817d1b35 ext4_sync_file ([kernel.kallsyms])
	ffffffff81732682 __x64_sys_fdatasync ([kernel.kallsyms])
	ffffffff81000130 entry_SYSCALL_64_after_hwframe ([kernel.kallsyms])
	            e0ee internal/runtime/syscall/linux.Syscall6 (/bin/ticketingd)
	          5a07a5 github.com/ticketing-dev/ticketing/internal/raftlog.datasync (/bin/ticketingd)

ticketing-bench  200/201    10.000002: cpu-clock:ppp: 
	          4a0000 main.(*worker).cycle (/bin/ticketing-bench)
	           93ac1 runtime.goexit.abi0 (/bin/ticketing-bench)

ticketingd  100/105    10.000003: cpu-clock:ppp: 
	          4b0000 runtime.mapaccess2_faststr (/bin/ticketingd)
	          4c0000 github.com/ticketing-dev/ticketing/server/internal/lockcore.(*Core).Acquire (/bin/ticketingd)

swapper     0/0     10.000004: cpu-clock:ppp: 
	ffffffff822613eb pv_native_safe_halt ([kernel.kallsyms])
`

func TestAccount(t *testing.T) {
	var out strings.Builder
	if err := run(strings.NewReader(sample), &out, map[string]string{"100": "leader", "200": "client"}, 1000, 1); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	// 1 ms of CPU per sample at 1000 Hz, over one cycle: 1000 µs each.
	for _, want := range []string{
		"4 samples (µs of CPU per cycle; idle 1000.00)",
		"| kind | leader | client | all |",
		"| client | 0.00 | 1000.00 | 1000.00 |",
		"| server | 1000.00 | 0.00 | 1000.00 |", // the map lookup is the core's
		"| kernel: fsync | 1000.00 | 0.00 | 1000.00 |",
		"| **all** | 2000.00 | 1000.00 | 3000.00 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in\n%s", want, got)
		}
	}
	if err := run(strings.NewReader("nothing\n"), &out, nil, 0, 0); err == nil {
		t.Error("no samples: no error")
	}
}

// TestOwnerRaft: the product's Raft (internal/raft, hashicorp/raft's
// copy), its log store and its transport are raft's; upstream's module
// still is.
func TestOwnerRaft(t *testing.T) {
	for _, fr := range []string{
		"5a07a5 github.com/ticketing-dev/ticketing/internal/raft.(*Raft).dispatchLogs (/bin/ticketingd)",
		"5a07a5 github.com/ticketing-dev/ticketing/internal/raftlog.datasync (/bin/ticketingd)",
		"5a07a5 github.com/ticketing-dev/ticketing/internal/raftnet.(*Transport).AppendEntries (/bin/ticketingd)",
		"5a07a5 github.com/hashicorp/raft.(*Raft).dispatchLogs (/bin/ticketingd)",
	} {
		if got := owner([]string{"5a07a0 runtime.chansend (/bin/ticketingd)", fr}); got != "raft" {
			t.Errorf("owner(%s) = %q, want raft", fr, got)
		}
	}
}
