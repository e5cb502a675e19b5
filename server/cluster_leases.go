package server

import "time"

// leaseSchedule is the leader's lease timing: the held keys whose token is
// known, in a binary min-heap by lease end (ckey.hidx is a key's 1-based
// position, 0 while it is not scheduled), and one timer at the earliest
// end. A timer and its closure per held key cost about 180 bytes of heap
// per lock on the leader; the heap costs a pointer and an int32. The
// timer fires exactly when the earliest lease ends, as the per-key timers
// did, and ends every lease that is due. Everything is under cluster.mu.
type leaseSchedule struct {
	h     []*ckey
	tm    timer // created at the stint's first arming, then Reset
	stint uint64
	at    int64 // when tm fires (server clock), while armed
	armed bool
}

// armLease schedules (or moves) the end of ck's lease at ck.leaseEnd.
func (cl *cluster) armLease(ck *ckey, now int64) {
	ls := &cl.leases
	if ck.hidx == 0 {
		ls.h = append(ls.h, ck)
		ck.hidx = int32(len(ls.h))
		ls.up(len(ls.h) - 1)
	} else {
		i := int(ck.hidx) - 1
		ls.up(i)
		ls.down(int(ck.hidx) - 1)
	}
	cl.rearmLeases(now)
}

// unarmLease takes ck off the schedule (its holding ended). The timer is
// left as it is: if it fires with nothing due, it is set for the next end.
func (cl *cluster) unarmLease(ck *ckey) {
	if ck.hidx == 0 {
		return
	}
	ls := &cl.leases
	i, last := int(ck.hidx)-1, len(ls.h)-1
	if i != last {
		ls.swap(i, last)
	}
	ls.h[last] = nil
	ls.h = ls.h[:last]
	ck.hidx = 0
	if i != last {
		ls.up(i)
		ls.down(i)
	}
}

// rearmLeases sets the timer for the earliest scheduled lease end.
func (cl *cluster) rearmLeases(now int64) {
	ls := &cl.leases
	if len(ls.h) == 0 {
		return // an armed timer that fires finds nothing due
	}
	end := ls.h[0].leaseEnd
	if ls.armed && ls.at <= end {
		return // it fires at or before the earliest end, and re-arms then
	}
	d := time.Duration(max(end-now, 0))
	if ls.tm == nil || ls.stint != cl.stint {
		stint := cl.stint
		ls.tm, ls.stint = cl.s.afterFunc(d, func() { cl.leasesDue(stint) }), stint
	} else {
		ls.tm.Reset(d)
	}
	ls.at, ls.armed = end, true
}

// leasesDue ends every lease that is due (a proposed Free of kind expire)
// and sets the timer for the next one.
func (cl *cluster) leasesDue(stint uint64) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if !cl.active || cl.stint != stint {
		return
	}
	ls := &cl.leases
	ls.armed = false
	now := cl.s.now()
	for len(ls.h) > 0 && ls.h[0].leaseEnd <= now {
		ck := ls.h[0]
		cl.unarmLease(ck)
		if ck.held && ck.token != 0 && cl.keys[ck.key] == ck {
			cl.freeLocked(ck, freeExpire, nil, 0, ck.owner, now)
		}
	}
	cl.rearmLeases(now)
}

// stopLeases stops the timer and forgets the schedule (the scheduler
// stops; the keys are dropped with it).
func (cl *cluster) stopLeases() {
	ls := &cl.leases
	if ls.tm != nil {
		ls.tm.Stop()
	}
	for _, ck := range ls.h {
		ck.hidx = 0
	}
	*ls = leaseSchedule{}
}

func (ls *leaseSchedule) less(i, j int) bool { return ls.h[i].leaseEnd < ls.h[j].leaseEnd }

func (ls *leaseSchedule) swap(i, j int) {
	ls.h[i], ls.h[j] = ls.h[j], ls.h[i]
	ls.h[i].hidx, ls.h[j].hidx = int32(i+1), int32(j+1)
}

func (ls *leaseSchedule) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !ls.less(i, p) {
			return
		}
		ls.swap(i, p)
		i = p
	}
}

func (ls *leaseSchedule) down(i int) {
	n := len(ls.h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && ls.less(r, l) {
			m = r
		}
		if !ls.less(m, i) {
			return
		}
		ls.swap(i, m)
		i = m
	}
}
