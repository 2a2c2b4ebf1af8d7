package groupcommit

// Waiting counts the callers in l, the sender's included.
func Waiting[T any](l *Line[T]) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.waiting)
}
