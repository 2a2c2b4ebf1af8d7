package httpapi

// queueRoutes registers the queues routes.
func (s *Server) queueRoutes() {}
