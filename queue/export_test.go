package queue

// CombinedReports returns how many combined reports c wrote, and how many
// reports they held.
func CombinedReports(c *Client) (writes, reports int64) {
	return c.reports.writes.Load(), c.reports.reports.Load()
}

// RememberedOutcomes returns how many outcomes c wrote from its memory of
// its claims, and how many such writes etcd refused as stale.
func RememberedOutcomes(c *Client) (hits, stale int64) {
	return c.claims.hits.Load(), c.claims.stale.Load()
}

// CombinedClaims returns how many combined claims c made, and how many
// claims they served with tasks.
func CombinedClaims(c *Client) (rounds, served int64) {
	return c.claimers.rounds.Load(), c.claimers.served.Load()
}
