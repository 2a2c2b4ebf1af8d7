package queue

// CombinedReports returns how many combined reports c wrote, and how many
// reports they held.
func CombinedReports(c *Client) (writes, reports int64) {
	return c.reports.writes.Load(), c.reports.reports.Load()
}
