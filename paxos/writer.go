package paxos

import (
	"errors"
	"sync"
	"time"
)

// The acceptor's durable writes, off the run loop. The loop hands each
// round's accepted entries (and a raised promise) to the writer and goes
// on; the replies that report them wait in the loop until the writer says
// that write is durable. So a slow fsync holds up only what depends on
// it, not the loop:
//   - a leader whose own disk stalls still hears its followers, and a
//     quorum of the others chooses the batch without it (Paxos needs a
//     majority of acceptors, not the leader among them);
//   - a follower whose disk stalls still applies what the leader says is
//     chosen and answers its own callers;
//   - while one fsync runs, the rounds after it queue their writes, and
//     the next fsync covers them all (group commit).
//
// etcd's raft has the same split (its AsyncStorageWrites: a node's log
// writes run beside its state machine, and messages that depend on them
// go out when they complete); it is built here because the acceptor's
// log is ours (wal.go).
//
// Writes are made in the order submitted, and a record carries the commit
// index as of its submission, so on disk the commit never covers an entry
// older than the one the node had in memory when it learned that commit.

// writeJob is one round's writes: the promise and the entries accepted in
// that round, and the commit index as of it.
type writeJob struct {
	seq      uint64
	promised Ballot
	commit   uint64
	entries  []Entry
	// write says the promise or entries need a record; a job with the
	// commit alone needs none (the next record, or Close, carries it).
	write bool
}

// writer makes the submitted jobs durable, in order, one goroutine, with
// one fsync for all the jobs waiting when it starts a write.
type writer struct {
	store *Storage
	// notify has a value when durable, err or took changed.
	notify chan struct{}

	mu      sync.Mutex
	queue   []writeJob
	wake    chan struct{} // has a value when queue grew or closing
	closing bool
	durable uint64        // every job up to this seq is durable
	err     error         // the first failed write; the writer takes no more
	took    time.Duration // the longest write since the last report
	done    chan struct{} // closed when the goroutine ends
}

// newWriter starts the writer of store; close ends it.
func newWriter(store *Storage) *writer {
	w := &writer{
		store:  store,
		notify: make(chan struct{}, 1),
		wake:   make(chan struct{}, 1),
		done:   make(chan struct{}),
	}
	go w.run()
	return w
}

// submit queues j; it never blocks on the disk.
func (w *writer) submit(j writeJob) {
	w.mu.Lock()
	w.queue = append(w.queue, j)
	w.mu.Unlock()
	notifyOne(w.wake)
}

// report returns how far the writes are durable, the first error, and the
// longest write since the last report.
func (w *writer) report() (durable uint64, took time.Duration, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	took, w.took = w.took, 0
	return w.durable, took, w.err
}

// close makes the queued jobs durable (unless a write failed) and ends
// the goroutine. Safe to call twice.
func (w *writer) close() {
	w.mu.Lock()
	w.closing = true
	w.mu.Unlock()
	notifyOne(w.wake)
	<-w.done
}

// run takes the queued jobs (up to writerMaxEntries entries) and writes
// them as one record, until closed or a write fails.
func (w *writer) run() {
	defer close(w.done)
	for range w.wake {
		for {
			w.mu.Lock()
			jobs, closing, failed := w.take(), w.closing, w.err != nil
			w.mu.Unlock()
			if len(jobs) == 0 || failed {
				if closing || failed {
					return
				}
				break
			}
			began := time.Now()
			err := w.write(jobs)
			took := time.Since(began)
			w.mu.Lock()
			if err != nil {
				w.err = err
			} else {
				w.durable = jobs[len(jobs)-1].seq
			}
			w.took = max(w.took, took)
			w.mu.Unlock()
			notifyOne(w.notify)
		}
	}
}

// writerMaxEntries bounds the entries of one record: after a long stall
// of the disk the jobs that queued meanwhile are written a bounded record
// at a time (a record is at most walMaxRecord bytes).
const writerMaxEntries = 8192

// take removes and returns the queued jobs up to writerMaxEntries entries
// (one job at least); the caller holds mu.
func (w *writer) take() []writeJob {
	k, n := 0, 0
	for k < len(w.queue) && (k == 0 || n+len(w.queue[k].entries) <= writerMaxEntries) {
		n += len(w.queue[k].entries)
		k++
	}
	jobs := w.queue[:k:k]
	w.queue = w.queue[k:]
	if len(w.queue) == 0 {
		w.queue = nil
	}
	return jobs
}

// write makes jobs durable with at most one record (one fsync).
func (w *writer) write(jobs []writeJob) error {
	var promised Ballot
	var commit uint64
	var entries []Entry
	write := false
	for _, j := range jobs {
		if promised.Less(j.promised) {
			promised = j.promised
		}
		commit = max(commit, j.commit)
		entries = append(entries, j.entries...)
		write = write || j.write
	}
	return w.store.acceptCommit(promised, commit, entries, write)
}

// errWriterEnded is a wait for a write after the writer was closed.
var errWriterEnded = errors.New("paxos: the acceptor's writer has ended")

// ended reports whether the goroutine has ended.
func (w *writer) ended() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// notifyOne puts a value in c (capacity 1) unless one is waiting there.
func notifyOne(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
