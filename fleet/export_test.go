package fleet

// PendingUsed is how many admitted attempts the gate is tracking.
func (g *BudgetGate) PendingUsed() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.used)
}
