package integration_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/integration/checker"
	"github.com/ticketing-dev/ticketing/integration/harness"
	"github.com/ticketing-dev/ticketing/internal/testdb"
	"github.com/ticketing-dev/ticketing/migrations"
)

// The chaos test's knobs. The run length is TICKETING_CHAOS_DURATION (a Go
// duration); default 30 s when CI=true, 8 s otherwise.
const (
	chaosWorkers = 4
	chaosKey     = "counter"
	chaosLease   = time.Second
	chaosThink   = 60 * time.Millisecond // holding -> transaction
	chaosWork    = 60 * time.Millisecond // read -> write, inside the transaction
	// A pause lasts longer than the lease. Pauses alternate between two
	// landing zones after "holding": before the transaction (another
	// worker acquires and writes meanwhile, so the token is stale) and
	// inside it, between the read and the write (with the fence: the lease
	// check refuses the commit while the others wait on the fence's row
	// lock; without: a lost update). One worker is paused at a time, with
	// a gap between pauses so that the others make progress.
	chaosPauseMin     = 1300 * time.Millisecond
	chaosPauseMax     = 2300 * time.Millisecond
	chaosGapMin       = 300 * time.Millisecond
	chaosGapMax       = 800 * time.Millisecond
	chaosKillEveryMin = 3 * time.Second
	chaosKillEveryMax = 5 * time.Second
	chaosDownMin      = 100 * time.Millisecond
	chaosDownMax      = 600 * time.Millisecond
	chaosControlMax   = 12 * time.Second // length of the control run, at most
)

const counterWorkerPkg = "github.com/ticketing-dev/ticketing/integration/cmd/counterworker"

func chaosDuration(t *testing.T) time.Duration {
	if s := os.Getenv("TICKETING_CHAOS_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("TICKETING_CHAOS_DURATION=%q: not a positive duration", s)
		}
		return d
	}
	if os.Getenv("CI") == "true" {
		return 30 * time.Second
	}
	return 8 * time.Second
}

// TestChaosFencedCounter: four counterworker processes increment one
// counter row with fenced read-modify-write transactions, while a nemesis
// SIGSTOPs lock holders past their 1 s lease and kill -9s and restarts
// ticketingd. Every worker event is recorded; the write log (one row per
// committed increment, written in the same transaction) must show no lost
// update and strictly increasing tokens in commit order, and the nemesis
// must have had teeth (a stale rejection, a kill). The control run does the
// same without the fence and must show lost updates: proof that the
// checker can fail. The database runs are parallel subtests.
func TestChaosFencedCounter(t *testing.T) {
	t.Parallel()
	d := chaosDuration(t)
	bin := harness.Ticketingd(t)
	worker := harness.Binary(t, counterWorkerPkg)

	for _, tc := range []struct {
		name    string
		dialect fence.Dialect
		fenced  bool
	}{
		// The control first: it is shorter, and with -parallel 2 (two
		// CPUs) the two long runs then overlap the proxy test.
		{"control-no-fence-postgres", fence.Postgres, false},
		{"postgres", fence.Postgres, true},
		{"mysql", fence.MySQL, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var dsn string
			if tc.dialect == fence.Postgres {
				dsn = testdb.Postgres(t)
			} else {
				dsn = testdb.MySQL(t)
			}
			run := chaosRun{bin: bin, worker: worker, dialect: tc.dialect, dsn: dsn, fenced: tc.fenced, duration: d}
			if !tc.fenced {
				// Lost updates show within seconds; keep CI short.
				run.duration = min(d, chaosControlMax)
			}
			runChaos(t, run)
		})
	}
}

type chaosRun struct {
	bin, worker string
	dialect     fence.Dialect
	dsn         string
	fenced      bool
	duration    time.Duration
}

func (r chaosRun) driver() (sqlDriver, workerDriver string) {
	if r.dialect == fence.MySQL {
		return "mysql", "mysql"
	}
	return "pgx", "postgres"
}

func runChaos(t *testing.T, r chaosRun) {
	ctx := t.Context()
	sqlDriver, workerDriver := r.driver()
	db, err := sql.Open(sqlDriver, r.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	setupCounter(t, ctx, db, r.dialect)

	srv := harness.StartServer(t, r.bin, harness.ServerOptions{Args: []string{"--token-block", "64"}})
	h := harness.NewHistory()
	h.WriteArtifactOnFailure(t, "chaos-history")

	// Workers.
	ws := make([]*chaosWorker, chaosWorkers)
	holding := make(chan int, 64) // worker index
	for i := range ws {
		args := []string{
			"--id", strconv.Itoa(i + 1), "--addr", srv.Addr(), "--driver", workerDriver, "--dsn", r.dsn,
			"--key", chaosKey, "--duration", r.duration.String(), "--lease", chaosLease.String(),
			"--think", chaosThink.String(), "--work", chaosWork.String(),
		}
		if !r.fenced {
			args = append(args, "--no-fence")
		}
		ws[i] = startChaosWorker(t, r.worker, fmt.Sprintf("w%d", i+1), args, h, func() {
			select {
			case holding <- i:
			default:
			}
		})
	}

	// Nemesis 1: pause holders past their lease, one at a time.
	var (
		pauses   atomic.Int64
		nemWG    sync.WaitGroup
		stopNem  = make(chan struct{})
		deadline = time.Now().Add(r.duration)
	)
	nemWG.Add(1)
	go func() {
		defer nemWG.Done()
		for n := 0; ; {
			var i int
			select {
			case <-stopNem:
				return
			case i = <-holding:
			}
			if time.Now().After(deadline) {
				continue
			}
			w := ws[i]
			at := rand.N(chaosThink / 2) // before the transaction
			if n%2 == 1 {
				at = chaosThink + 15*time.Millisecond + rand.N(chaosWork-20*time.Millisecond) // between read and write
			}
			time.Sleep(at)
			if w.signal(syscall.SIGSTOP) != nil {
				continue
			}
			n++
			pauses.Add(1)
			h.Event("nemesis", "pause", fmt.Sprintf("%s after %v", w.name, at))
			select {
			case <-time.After(chaosPauseMin + rand.N(chaosPauseMax-chaosPauseMin)):
			case <-stopNem:
			}
			_ = w.signal(syscall.SIGCONT)
			h.Event("nemesis", "resume", w.name)
			time.Sleep(chaosGapMin + rand.N(chaosGapMax-chaosGapMin))
			// Drop the "holding" lines that came meanwhile: they are old.
			for len(holding) > 0 {
				<-holding
			}
		}
	}()

	// Nemesis 2, in the test goroutine: kill -9 and restart the server.
	kills := 0
	for {
		next := chaosKillEveryMin + rand.N(chaosKillEveryMax-chaosKillEveryMin)
		if time.Until(deadline) < next+time.Second {
			break
		}
		time.Sleep(next)
		srv.Kill9()
		kills++
		h.Event("nemesis", "kill9", fmt.Sprintf("generation %d", srv.Generation()))
		time.Sleep(chaosDownMin + rand.N(chaosDownMax-chaosDownMin))
		srv.Restart(t)
		h.Event("nemesis", "restart", fmt.Sprintf("generation %d", srv.Generation()))
	}

	// The workers stop by themselves after the duration.
	for _, w := range ws {
		w.wait(t, time.Until(deadline)+30*time.Second)
	}
	close(stopNem)
	nemWG.Wait()

	// The database's view.
	rows, counter, highWater := readCounter(t, ctx, db, r.dialect)
	ops := h.Ops()
	cnt := func(kind, outcome string) int { return h.Count(kind, outcome) }
	t.Logf("chaos: ops=%d accepted=%d stale=%d indeterminate=%d kills=%d pauses=%d",
		len(h.Filter(harness.OfKind(harness.KindAcquire))),
		cnt(harness.KindFence, harness.OutcomeOK), cnt(harness.KindFence, harness.OutcomeStale), cnt(harness.KindAcquire, harness.OutcomeIndeterminate), kills, pauses.Load())
	t.Logf("chaos: %s fenced=%v duration=%v rows=%d counter=%d high_water=%d outcomes=%v", r.dialect, r.fenced, r.duration, len(rows), counter, highWater, h.Counts())

	// Checks common to both runs: the broker and the history.
	for _, err := range []error{
		harness.CheckOutcomes(h, harness.OfKind(harness.KindAcquire), harness.OutcomeOK, harness.OutcomeTimedOut,
			harness.OutcomeBusy, harness.OutcomeIndeterminate, harness.OutcomeUnsent,
			// A worker paused while its ACQUIRE was in flight gets a grant
			// whose conservative lease is already over.
			harness.OutcomeLeaseTooShort),
		harness.CheckNoTicketAfterIndeterminate(h),
		harness.CheckTokensUnique(h),
		harness.CheckTokensFollowRealTime(h),
		checker.LogMatchesHistory(rows, h),
	} {
		if err != nil {
			t.Error(err)
		}
	}
	for _, op := range ops {
		if op.Kind == harness.KindFence && op.Release != harness.OutcomeOK && op.Release != harness.OutcomeNotHeld && op.Release != harness.OutcomeReleaseUnconfirmed {
			t.Errorf("op %d (%s token %d): release outcome %q (%s)", op.Seq, op.Process, op.Token, op.Release, op.Err)
		}
	}
	if kills == 0 {
		t.Errorf("no server kill happened (duration %v too short?)", r.duration)
	}

	lost := checker.LostUpdates(rows, counter)
	if !r.fenced {
		// Control: the same checker must fail without the fence.
		logErr := checker.WriteLog(rows, counter, highWater)
		t.Logf("chaos control: lost updates detected=%d (rows=%d counter=%d); WriteLog says: %v", lost, len(rows), counter, firstLine(logErr))
		if lost == 0 || logErr == nil {
			t.Errorf("control run without the fence: no lost update detected (rows=%d, counter=%d, pauses=%d): the checker showed no teeth", len(rows), counter, pauses.Load())
		}
		return
	}
	if err := checker.WriteLog(rows, counter, highWater); err != nil {
		t.Error(err)
	}
	if lost != 0 {
		t.Errorf("%d lost updates with the fence", lost)
	}
	for _, op := range ops {
		if op.Kind == harness.KindFence && op.Outcome != harness.OutcomeOK && op.Outcome != harness.OutcomeStale &&
			op.Outcome != harness.OutcomeLeaseExpired && op.Outcome != harness.OutcomeCommitUnknown {
			t.Errorf("op %d (%s token %d): write outcome %q: %s", op.Seq, op.Process, op.Token, op.Outcome, op.Err)
		}
	}
	if cnt(harness.KindFence, harness.OutcomeStale) == 0 {
		t.Errorf("no stale rejection: the nemesis had no teeth (pauses=%d kills=%d)", pauses.Load(), kills)
	}
	if len(rows) == 0 {
		t.Error("no write committed")
	}
}

func firstLine(err error) string {
	if err == nil {
		return "<nil>"
	}
	s := err.Error()
	for i, c := range s {
		if c == '\n' {
			return s[:i] + " ..."
		}
	}
	return s
}

func setupCounter(t *testing.T, ctx context.Context, db *sql.DB, d fence.Dialect) {
	t.Helper()
	if err := migrations.Up(ctx, db, d); err != nil {
		t.Fatal(err)
	}
	stmts := []string{
		"CREATE TABLE counter (id INT PRIMARY KEY, value BIGINT NOT NULL)",
		"INSERT INTO counter (id, value) VALUES (1, 0)",
		`CREATE TABLE write_log (id BIGSERIAL PRIMARY KEY, worker INT NOT NULL, token BIGINT NOT NULL,
			read_value BIGINT NOT NULL, wrote_value BIGINT NOT NULL, fenced BOOLEAN NOT NULL)`,
	}
	if d == fence.MySQL {
		stmts[2] = `CREATE TABLE write_log (id BIGINT AUTO_INCREMENT PRIMARY KEY, worker INT NOT NULL, token BIGINT NOT NULL,
			read_value BIGINT NOT NULL, wrote_value BIGINT NOT NULL, fenced BOOLEAN NOT NULL) ENGINE=InnoDB`
	}
	for _, s := range stmts {
		if _, err := db.ExecContext(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

func readCounter(t *testing.T, ctx context.Context, db *sql.DB, d fence.Dialect) (rows []checker.LogRow, counter int64, highWater uint64) {
	t.Helper()
	rs, err := db.QueryContext(ctx, "SELECT id, worker, token, read_value, wrote_value FROM write_log ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	for rs.Next() {
		var r checker.LogRow
		var w int
		var tok int64
		if err := rs.Scan(&r.ID, &w, &tok, &r.Read, &r.Wrote); err != nil {
			t.Fatal(err)
		}
		r.Process, r.Token = fmt.Sprintf("w%d", w), uint64(tok)
		rows = append(rows, r)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, "SELECT value FROM counter WHERE id = 1").Scan(&counter); err != nil {
		t.Fatal(err)
	}
	q := "SELECT high_water FROM ticketing_fence WHERE resource = $1"
	if d == fence.MySQL {
		q = "SELECT high_water FROM ticketing_fence WHERE resource = ?"
	}
	var hw int64
	switch err := db.QueryRowContext(ctx, q, []byte(chaosKey)).Scan(&hw); err {
	case nil:
		highWater = uint64(hw)
	case sql.ErrNoRows:
	default:
		t.Fatal(err)
	}
	return rows, counter, highWater
}

// workerEvent is counterworker's output line (see its package doc).
type workerEvent struct {
	Ev       string `json:"ev"`
	W        int    `json:"w"`
	Op       int    `json:"op"`
	Wall     int64  `json:"wall"`
	T        int64  `json:"t"`
	T0       int64  `json:"t0"`
	T1       int64  `json:"t1"`
	Outcome  string `json:"outcome"`
	Release  string `json:"release"`
	Token    uint64 `json:"token"`
	Deadline int64  `json:"deadline"`
	Read     *int64 `json:"read"`
	Wrote    *int64 `json:"wrote"`
	Err      string `json:"err"`
}

// chaosWorker is one counterworker subprocess. Its stdout is read line by
// line into the history as the lines come (the "holding" line drives the
// pausing nemesis).
type chaosWorker struct {
	name    string
	cmd     *exec.Cmd
	stderr  *harness.LogBuffer
	done    chan struct{} // closed when the process exited and stdout is read
	waitErr error
	events  atomic.Int64
}

func startChaosWorker(t *testing.T, bin, name string, args []string, h *harness.History, onHolding func()) *chaosWorker {
	t.Helper()
	w := &chaosWorker{name: name, cmd: exec.Command(bin, args...), stderr: harness.NewLogBuffer(), done: make(chan struct{})}
	w.cmd.Stderr = w.stderr
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	var bad []string
	go func() {
		defer close(w.done)
		var origin time.Duration
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			var ev workerEvent
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				bad = append(bad, sc.Text())
				continue
			}
			w.events.Add(1)
			at := func(ns int64) time.Duration { return origin + time.Duration(ns) }
			switch ev.Ev {
			case "start":
				origin = h.FromWall(ev.Wall)
			case "acquire":
				op := harness.Op{Process: name, Kind: harness.KindAcquire, Key: chaosKey, Invoke: at(ev.T0), Complete: at(ev.T1),
					Outcome: ev.Outcome, Token: ev.Token, Err: ev.Err, Note: fmt.Sprintf("op %d", ev.Op)}
				if ev.Outcome == harness.OutcomeOK {
					op.Deadline = at(ev.Deadline)
				}
				h.Record(op)
			case "holding":
				onHolding()
			case "write":
				h.Record(harness.Op{Process: name, Kind: harness.KindFence, Key: chaosKey, Invoke: at(ev.T0), Complete: at(ev.T1),
					Outcome: ev.Outcome, Release: ev.Release, Token: ev.Token, Read: ev.Read, Wrote: ev.Wrote, Err: ev.Err,
					Note: fmt.Sprintf("op %d", ev.Op)})
			}
		}
		w.waitErr = w.cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = w.cmd.Process.Signal(syscall.SIGCONT)
		_ = w.cmd.Process.Kill()
		<-w.done
		if t.Failed() {
			t.Logf("--- %s stderr:\n%s", name, w.stderr.String())
			if len(bad) > 0 {
				t.Logf("--- %s unparsed stdout lines: %q", name, bad)
			}
		}
	})
	return w
}

func (w *chaosWorker) signal(sig syscall.Signal) error {
	select {
	case <-w.done:
		return os.ErrProcessDone
	default:
	}
	return w.cmd.Process.Signal(sig)
}

// wait waits for the worker to exit by itself and checks its exit status.
func (w *chaosWorker) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-w.done:
	case <-time.After(timeout):
		_ = w.cmd.Process.Signal(syscall.SIGCONT)
		_ = w.cmd.Process.Kill()
		<-w.done
		t.Errorf("%s did not finish within %v (killed)", w.name, timeout)
		return
	}
	if w.waitErr != nil {
		t.Errorf("%s: %v\nstderr:\n%s", w.name, w.waitErr, w.stderr.String())
	}
	if w.events.Load() == 0 {
		t.Errorf("%s reported nothing", w.name)
	}
}
