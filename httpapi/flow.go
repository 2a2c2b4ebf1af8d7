package httpapi

// flowRoutes registers the flow routes.
func (s *Server) flowRoutes() {}
