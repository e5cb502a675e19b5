package raftlog

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/ticketing-dev/ticketing/internal/raft"
)

// TestGetLogDuringZeroAhead: GetLog runs alongside StoreLogs that write
// zeros ahead (batches smaller and larger than a zero chunk, segments
// smaller and larger than one) and tail truncations; every entry read is
// whole and the one stored at its index (of some term).
func TestGetLogDuringZeroAhead(t *testing.T) {
	for _, segSize := range []int64{4096, 3 << 20} {
		t.Run(fmt.Sprint(segSize), func(t *testing.T) {
			s := open(t, t.TempDir(), segSize)
			defer func() { s.Close() }()
			mustStore(t, s, entries(1, 1, 1, 10))
			stop := make(chan struct{})
			var wg sync.WaitGroup
			errc := make(chan error, 4)
			for r := 0; r < 2; r++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var l raft.Log
					for {
						select {
						case <-stop:
							return
						default:
						}
						first, _ := s.FirstIndex()
						last, _ := s.LastIndex()
						if last < first || first == 0 {
							continue
						}
						i := first + rand.Uint64N(last-first+1)
						err := s.GetLog(i, &l)
						if errors.Is(err, raft.ErrLogNotFound) {
							continue // truncated meanwhile
						}
						if err != nil {
							errc <- err
							return
						}
						if want := entry(i, l.Term, len(l.Data)); l.Index != i || !bytes.Equal(l.Data, want.Data) {
							errc <- fmt.Errorf("GetLog(%d) = index %d term %d, data not as stored", i, l.Index, l.Term)
							return
						}
					}
				}()
			}
			term := uint64(1)
			for step := 0; step < 150; step++ {
				last, _ := s.LastIndex()
				if step%25 == 24 && last > 5 {
					if err := s.DeleteRange(last-rand.Uint64N(last/2), last); err != nil {
						t.Fatal(err)
					}
					term++
					continue
				}
				n, size := 1+rand.IntN(8), 16+rand.IntN(64<<10)
				if step%50 == 7 {
					n, size = 3, 600<<10 // a batch larger than a chunk
				}
				next, _ := s.LastIndex()
				mustStore(t, s, entries(next+1, next+uint64(n), term, size))
			}
			close(stop)
			wg.Wait()
			select {
			case err := <-errc:
				t.Fatal(err)
			default:
			}
			last, _ := s.LastIndex()
			s = reopen(t, s)
			if got, _ := s.LastIndex(); got != last {
				t.Fatalf("reopened: LastIndex %d, want %d", got, last)
			}
		})
	}
}
