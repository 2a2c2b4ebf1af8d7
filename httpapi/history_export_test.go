package httpapi

// Follows says whether s's dashboard hub follows namespace ns (keeps its
// queue history).
func Follows(s *Server, ns string) bool {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	_, ok := s.hub.spaces[ns]
	return ok
}
