package storeguard

import (
	"sync"
	"time"

	"github.com/droverhq/drover"
)

// Settle is how long after a write commits a measurement of the database
// is trusted to count it: etcd applies a write at once but commits it to
// its database file in batches (every 100 ms by default), and the size it
// reports is the last batch's. A write stays counted against the headroom
// until a measurement begun at least Settle after it completed.
const Settle = 250 * time.Millisecond

// maxDone bounds the completions an [Admission] remembers between two
// measurements. Past it the two oldest are merged into one that finished
// as late as the later and counts only what the earlier did: a
// measurement then counts fewer writes as settled, never more.
const maxDone = 4096

// Admission reserves what each data-plane write will add to etcd's
// database against the headroom below the high-water mark, before the
// write is sent: headroom is what the store guard last measured (the
// high-water mark minus the database's size) minus the bytes admitted
// since. A write that does not fit is refused with a
// *drover.StoreFullError, so that a burst of submissions cannot outrun the
// guard's periodic check, and concurrent writers cannot all pass on the
// same stale reading: each reservation is taken under one lock.
//
// One Admission serves one process (a drover server): the guards of that
// process refresh it ([Admission.Mark] before they read a member's size,
// [Admission.Refresh] after), and the process's etcd client checks every
// data-plane transaction against it ([NewKV]). Writers in other processes
// are not counted until a measurement sees what they wrote.
//
// Until a guard has measured, every write is admitted (the guard key
// alone refuses). With several members measured (an external cluster),
// a write must fit the headroom of each.
//
// The zero Admission is not usable; use [NewAdmission].
type Admission struct {
	now      func() time.Time
	mu       sync.Mutex
	total    int64 // bytes reserved and not given back, since the start
	inflight int64 // bytes reserved by writes not finished yet
	done     []completion
	floor    int64 // settled bytes of the newest completion a Mark passed
	members  map[string]measure
	kicked   bool
	kicks    []chan struct{}
	refusal  int64 // the largest write refused since the last Mark, in bytes
	admitted int64
	refused  int64
}

// measure is one member's last measurement.
type measure struct {
	headroom int64 // the high-water mark in bytes minus the measured size
	full     bool  // the guard keys are set or the alarm raised: nothing fits
	base     int64 // reserved bytes the measured size counts
	size     int64
	quota    int64
	high     float64
	low      float64
}

// completion is a write that finished: when, and the bytes of every
// write finished by then (settled) that took place.
type completion struct {
	at      time.Time
	settled int64
}

// Mark is the state of an [Admission] when a measurement begins.
type Mark struct {
	base    int64 // reserved bytes of the writes finished Settle before it
	refusal int64
}

// Refused returns the size of the largest write refused since the
// previous Mark, in bytes; 0 when none was refused. The guard asks
// [Admission.Fits] whether it would fit once measured again, and sets its
// keys when it still would not: a store that refuses this process's
// writes is full for every writer.
func (m Mark) Refused() int64 { return m.refusal }

// Fits reports whether a write of n bytes would be admitted now, and the
// usage it would bring the fullest member measured to (0 with none
// measured). It reserves nothing.
func (a *Admission) Fits(n int64) (usage int64, fits bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	fits = true
	for _, m := range a.members {
		u := m.size + max(a.total-m.base, 0) + n
		usage = max(usage, u)
		if n > 0 && (m.full || u-m.size > m.headroom) {
			fits = false
		}
	}
	return usage, fits
}

// NewAdmission returns an Admission that admits every write until a guard
// refreshes it. now tells the time (nil: time.Now); pass the guards' own
// clock.
func NewAdmission(now func() time.Time) *Admission {
	if now == nil {
		now = time.Now
	}
	return &Admission{now: now, members: map[string]measure{}}
}

// Reservation is an admitted write's share of the headroom; call Done once
// the write is over.
type Reservation struct {
	a    *Admission
	n    int64
	done bool
}

// Reserve admits a write that adds n bytes, or refuses it with a
// *drover.StoreFullError when n does not fit the headroom left. A write
// that adds nothing (n <= 0) is always admitted.
func (a *Admission) Reserve(n int64) (*Reservation, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, m := range a.members {
		used := a.total - m.base
		if n > 0 && (m.full || used+n > m.headroom) {
			a.refused++
			a.kick()
			usage := m.size
			if !m.full {
				usage += max(used, 0) + n // what the store would hold
			}
			a.refusal = max(a.refusal, n)
			return nil, &drover.StoreFullError{Usage: usage, Quota: m.quota, HighWater: m.high, LowWater: m.low}
		}
	}
	a.total += n
	a.inflight += n
	a.admitted++
	for _, m := range a.members {
		// Past half of a member's headroom, the guards measure again at
		// once rather than at their next interval.
		if !a.kicked && a.total-m.base > m.headroom/2 {
			a.kicked = true
			a.kick()
		}
	}
	return &Reservation{a: a, n: n}, nil
}

// Done ends the reservation: written says whether the write may have
// taken place; a write that certainly did not gives its bytes back. A
// second Done does nothing.
func (r *Reservation) Done(written bool) {
	a := r.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.done {
		return
	}
	r.done = true
	a.inflight -= r.n
	if !written {
		a.total -= r.n
		return
	}
	a.done = append(a.done, completion{at: a.now(), settled: a.total - a.inflight})
	if len(a.done) > maxDone {
		// Merge the two oldest: settled no sooner than the later one
		// finished, counting only what the earlier one did.
		a.done[1].settled = a.done[0].settled
		a.done = a.done[1:]
	}
}

// kick wakes every guard's loop, without waiting; a.mu is held.
func (a *Admission) kick() {
	for _, c := range a.kicks {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// Kicks returns a channel of this caller's own that receives when a
// reservation has used half of a member's headroom, or was refused: the
// guard that reads it measures at once.
func (a *Admission) Kicks() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := make(chan struct{}, 1)
	a.kicks = append(a.kicks, c)
	return c
}

// Mark notes that a measurement begins; pass it to Refresh with what was
// measured. It takes as counted by the measurement the writes that
// finished at least [Settle] before now, all of which are known now, so
// that each measurement counts what was settled when it began, whichever
// member's measurement is refreshed first.
func (a *Admission) Mark() Mark {
	a.mu.Lock()
	defer a.mu.Unlock()
	base, n := a.floor, 0
	settled := a.now().Add(-Settle)
	for _, c := range a.done {
		if c.at.After(settled) {
			break
		}
		base, n = c.settled, n+1
	}
	// Marks to come begin later: they count at least these completions,
	// whose figure the floor keeps.
	if n > 0 {
		a.floor = base
		a.done = append(a.done[:0], a.done[n:]...)
	}
	m := Mark{base: base, refusal: a.refusal}
	a.refusal = 0
	return m
}

// Refresh records what a guard measured of member (its database's size
// in bytes, its quota, the water marks as fractions of it) in a
// measurement begun at m. full says the store is refused anyway (the
// guard keys are set, or etcd's NOSPACE alarm is raised): no write fits
// then. The writes that finished at least [Settle] before m are taken as
// counted in size; the others, and those under way, stay reserved.
func (a *Admission) Refresh(member string, m Mark, size, quota int64, high, low float64, full bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.members[member] = measure{headroom: int64(high*float64(quota)) - size, full: full, base: m.base, size: size, quota: quota, high: high, low: low}
	a.kicked = false
}

// Forget drops member's measurement (its guard could not measure it, or
// it has no quota): its headroom no longer limits writes.
func (a *Admission) Forget(member string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.members, member)
}

// AdmissionStats counts an Admission's decisions.
type AdmissionStats struct {
	// Admitted and Refused count reservations.
	Admitted, Refused int64
	// Reserved is the bytes reserved and not given back since the start.
	Reserved int64
}

// Stats returns the decisions so far.
func (a *Admission) Stats() AdmissionStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return AdmissionStats{Admitted: a.admitted, Refused: a.refused, Reserved: a.total}
}
