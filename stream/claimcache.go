package stream

import "sync"

// ClaimCache keeps the claims that requests read to write under, so that
// the later requests of the same attempt skip reading them again: an
// Agent Server run's start reads its task's claim, and the run's stream
// appends and its outcome take it from here.
//
// A cached claim is safe because it is never trusted by itself: every
// write under it, Writer.Append and a run's outcome, compares the claim's
// fence (Fence.Compares) in its etcd transaction. A claim lost since it
// was cached (the session ended, the task was cancelled, claimed again,
// or its outcome written) fails those compares: etcd refuses the write,
// and the caller forgets the entry and reads the claim again, which
// answers as it would have without the cache. What is cached only saves
// reads; it never lets a write in.
//
// Entries are keyed by namespace, task and token, and remember the
// session they were checked under (its whole id: an id with another
// secret is not the same session). A route that authenticates a session
// uses Held, which answers only an entry of that session; a route whose
// own check is the token alone uses Token. The cache holds at most
// MaxCachedClaims entries, dropping those least recently used first (in
// halves). The zero value is ready to use; a nil cache keeps nothing.
type ClaimCache struct {
	mu sync.Mutex
	// cur and old are two generations: an entry is put or found in cur;
	// when cur is full, it becomes old and the former old is dropped.
	cur, old map[ClaimKey]cachedClaim
}

// ClaimKey names a cached claim: a task of a namespace, claimed with a
// token.
type ClaimKey struct {
	NS, Task string
	Token    int64
}

type cachedClaim struct {
	session string
	claim   Claim
}

// MaxCachedClaims bounds the entries of a ClaimCache.
const MaxCachedClaims = 10_000

// Held answers the claim cached for k if it was checked under session.
func (c *ClaimCache) Held(k ClaimKey, session string) (Claim, bool) {
	e, ok := c.find(k)
	if !ok || e.session != session {
		return Claim{}, false
	}
	return e.claim, true
}

// Token answers the claim cached for k whatever its session: for a route
// whose own check of the claim is its token alone.
func (c *ClaimCache) Token(k ClaimKey) (Claim, bool) {
	e, ok := c.find(k)
	return e.claim, ok
}

// find answers k's entry, moved to the newer generation.
func (c *ClaimCache) find(k ClaimKey) (cachedClaim, bool) {
	if c == nil {
		return cachedClaim{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.cur[k]; ok {
		return e, true
	}
	e, ok := c.old[k]
	if ok {
		delete(c.old, k)
		c.add(k, e)
	}
	return e, ok
}

// Put caches claim cl of k, checked under session.
func (c *ClaimCache) Put(k ClaimKey, session string, cl Claim) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.old, k)
	c.add(k, cachedClaim{session: session, claim: cl})
}

// add puts e in the newer generation, which becomes the older one when
// it holds half the bound. c.mu is held.
func (c *ClaimCache) add(k ClaimKey, e cachedClaim) {
	if _, ok := c.cur[k]; !ok && len(c.cur) >= MaxCachedClaims/2 {
		c.old, c.cur = c.cur, nil
	}
	if c.cur == nil {
		c.cur = make(map[ClaimKey]cachedClaim)
	}
	c.cur[k] = e
}

// Forget drops k's entry: its claim was found stale (a write under it
// was refused), or its attempt ended.
func (c *ClaimCache) Forget(k ClaimKey) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.cur, k)
	delete(c.old, k)
}

// Len is the number of entries cached.
func (c *ClaimCache) Len() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.cur) + len(c.old)
}
