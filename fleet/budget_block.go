package fleet

import (
	"context"
	"net/http"
	"time"

	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/queue"
)

// Blocks: reserving ahead. A task's reserve waited, in its running slot,
// for the budget's transaction in flight and then its batch's. While a
// budget has ample room, the gate instead reserves a block (budget's
// WithBlock) of blockCalls requests and as many tasks' estimates for a
// tenant, one transaction, and admits that tenant's tasks from it
// locally, with no round trip; the next block is reserved in the
// background once half of one is used, and admits once that one is used
// up (so a block's requests are all used while tasks keep coming, and a
// tenant's tasks take one reserve and one settle per blockCalls tasks).
// A block closes when it is used up, when its window ends, after
// blockMaxAge, or on Flush; once its
// last task ended it is settled once, with the tokens its tasks used (and
// the provider's headers of the last that reported any), its unused
// requests given back. It lives under the worker's lease: a worker that
// dies releases it whole, as it releases its tasks' own reservations.
// Near the budget's limits (less room left than blockRoom blocks) the
// gate reserves task by task, so blocks never hold back room another
// tenant or worker could be refused for.
//
// A block's size follows its tenant's demand while the room is ample: a
// tenant's first block holds blockCalls requests; each of its blocks used
// up doubles the next (to at most maxBlockCalls), and one that closes
// with more than half its requests unused (its age, its window, Flush)
// brings the next back to blockCalls, as does a block the budget refuses
// (one of blockCalls may still fit the tenant's cap or share). A block above blockCalls is taken
// only while the budget has room for blockSpare times blockRoom blocks of
// its size (a 32nd of the room this worker last saw), so a busy tenant's
// blocks shrink back to blockCalls well before the limits; the budget's
// own rule (budget.BlockRoom blocks of the size asked) is unchanged.

const (
	// blockCalls is the requests of a tenant's first block, and of every
	// block near the limits.
	blockCalls = 32
	// maxBlockCalls is the requests of the largest block.
	maxBlockCalls = 256
	// blockSpare is how many times blockRoom blocks of a size above
	// blockCalls the budget's room must hold for the gate to take one.
	blockSpare = 4
	// blockRoom is how many blocks' worth of tokens and requests the
	// budget must have left, after the gate's last reservation, for the
	// gate to try a block (the budget itself refuses one without room
	// for budget.BlockRoom of them).
	blockRoom = budget.BlockRoom
	// blockMaxAge is the longest a block admits tasks.
	blockMaxAge = time.Second
)

// blockKey names the blocks of one tenant of one budget.
type blockKey struct{ budget, tenant string }

// block is a reservation of many tasks' estimates, admitted from locally.
type block struct {
	r              budget.Reservation
	size           int64 // requests it held
	tokens, calls  int64 // left to admit
	running        int
	used, admitted int64
	h              http.Header // the provider's headers of the last task that reported any
	closed         bool
}

// defaultKey names a budget's default estimate for a task type.
type defaultKey struct{ budget, taskType string }

// learned is a default estimate as a reservation found it, and when.
type learned struct {
	est int64
	at  time.Time
}

// maxDefaults bounds the default estimates a gate remembers.
const maxDefaults = 1000

// noteDefaultLocked remembers that budget's default estimate for
// taskType was est, as a reservation just found it; g.mu held.
func (g *BudgetGate) noteDefaultLocked(budget, taskType string, est int64) {
	if len(g.defaults) >= maxDefaults {
		clear(g.defaults)
	}
	g.defaults[defaultKey{budget, taskType}] = learned{est, g.now()}
}

// admitFromBlock admits t from its tenant's open block, with its
// estimated_tokens or, without them, its type's default as a reservation
// found it less than blockMaxAge ago (a changed default is thus used by
// blocks within blockMaxAge, as a block lives no longer); false: t is to
// be reserved alone.
func (g *BudgetGate) admitFromBlock(t *queue.Task) (func(error), bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	est := t.Metadata.EstimatedTokens
	if est == 0 {
		if d, ok := g.defaults[defaultKey{t.Metadata.Budget, t.Type}]; ok && g.now().Sub(d.at) < blockMaxAge {
			est = d.est
		}
	}
	if est <= 0 {
		return nil, false
	}
	b, ok := g.fromBlock(t, est)
	if !ok {
		return nil, false
	}
	key := usedKey(t)
	g.used[key] = report{tokens: -1}
	return func(runErr error) { g.endTask(key, b, est, runErr) }, true
}

// fromBlock admits t (estimate est) from its tenant's open block, and
// says whether it did; g.mu held.
func (g *BudgetGate) fromBlock(t *queue.Task, est int64) (*block, bool) {
	k := blockKey{t.Metadata.Budget, t.Metadata.Tenant}
	b := g.blocks[k]
	if b != nil && !g.admitsLocked(b, est) {
		g.closeLocked(k, b)
		b = nil
	}
	if n := g.next[k]; b == nil && n != nil { // the next block takes over
		delete(g.next, k)
		if g.admitsLocked(n, est) {
			b = n
			g.blocks[k] = b
		} else {
			g.closeLocked(k, n)
		}
	}
	if b == nil || (b.calls <= b.size/2 && g.next[k] == nil) {
		g.takeBlockLocked(k, est)
	}
	if b == nil {
		return nil, false
	}
	b.tokens -= est
	b.calls--
	b.running++
	b.admitted++
	return b, true
}

// admitsLocked says whether block b can admit a task of estimate est:
// open, with the tokens and a request left, in its window; g.mu held.
func (g *BudgetGate) admitsLocked(b *block, est int64) bool {
	return !b.closed && b.tokens >= est && b.calls >= 1 && g.now().Before(b.r.WindowEnd())
}

// takeBlockLocked reserves tenant k's next block in the background when
// the budget's room, as the gate last saw it, allows; g.mu held.
func (g *BudgetGate) takeBlockLocked(k blockKey, est int64) {
	rm, ok := g.room[k.budget]
	if g.taking[k] || !ok || est <= 0 || rm[0] < blockRoom*blockCalls*est || rm[1] < blockRoom*blockCalls {
		return
	}
	n := int64(blockCalls)
	for n < min(g.sizes[k], maxBlockCalls) && rm[0] >= blockSpare*blockRoom*2*n*est && rm[1] >= blockSpare*blockRoom*2*n {
		n *= 2
	}
	g.taking[k] = true
	g.settling.begin()
	go func() {
		defer g.settling.end()
		ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
		defer cancel()
		r, err := g.c.Reserve(ctx, k.budget, k.tenant, n*est, budget.WithLease(g.lease()), budget.WithBlock(n))
		g.mu.Lock()
		defer g.mu.Unlock()
		delete(g.taking, k)
		if err != nil {
			delete(g.room, k.budget) // until a task's reserve says again
			delete(g.sizes, k)       // the next is of blockCalls, which may fit (a tenant near its cap or share)
			return
		}
		g.noteRoomLocked(r)
		b := &block{r: r, size: n, tokens: r.Estimate, calls: n}
		if old := g.next[k]; old != nil {
			g.closeLocked(k, old)
		}
		if old := g.blocks[k]; old != nil && g.admitsLocked(old, 1) {
			g.next[k] = b // admitted from once old is used up
		} else {
			if old != nil {
				g.closeLocked(k, old)
			}
			g.blocks[k] = b
		}
		age := min(blockMaxAge, r.WindowEnd().Sub(g.now()))
		g.afterFunc(age, func() {
			g.mu.Lock()
			g.closeLocked(k, b)
			g.mu.Unlock()
		})
	}()
}

// noteRoomLocked remembers the room r's reserve left in its budget; g.mu
// held.
func (g *BudgetGate) noteRoomLocked(r budget.Reservation) {
	tokens, requests := r.Room()
	g.room[r.Budget] = [2]int64{tokens, requests}
}

// closeLocked closes block b of k: it admits no more, and is settled once
// its last task ended; g.mu held.
func (g *BudgetGate) closeLocked(k blockKey, b *block) {
	if g.blocks[k] == b {
		delete(g.blocks, k)
	}
	if g.next[k] == b {
		delete(g.next, k)
	}
	if b.closed {
		return
	}
	b.closed = true
	switch {
	case b.calls == 0: // used up: the tenant's next block is twice as big
		if len(g.sizes) >= maxDefaults {
			clear(g.sizes)
		}
		g.sizes[k] = min(2*b.size, maxBlockCalls)
	case b.calls > b.size/2:
		delete(g.sizes, k)
	}
	g.settleBlockLocked(b)
}

// endInBlock records a task of b ended, having used actual tokens (h:
// the provider's headers it reported, if any); g.mu held.
func (g *BudgetGate) endInBlock(b *block, actual int64, h http.Header) {
	b.used += actual
	b.running--
	if h != nil {
		b.h = h
	}
	g.settleBlockLocked(b)
}

// settleBlockLocked settles b in the background once it is closed and
// its last task ended; g.mu held.
func (g *BudgetGate) settleBlockLocked(b *block) {
	if !b.closed || b.running > 0 {
		return
	}
	b.running = -1 // settled once
	g.settling.begin()
	go func() {
		defer g.settling.end()
		ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
		defer cancel()
		if _, err := g.c.SettleBlock(ctx, b.r, min(b.used, b.r.Bound), b.admitted, b.h); err != nil {
			g.logger.Warn("budget settle of a block failed", "budget", b.r.Budget, "tenant", b.r.Tenant, "err", err)
		}
	}()
}

// closeBlocks closes every open block (they settle once their tasks
// ended).
func (g *BudgetGate) closeBlocks() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, b := range g.blocks {
		g.closeLocked(k, b)
	}
	for k, b := range g.next {
		g.closeLocked(k, b)
	}
}
