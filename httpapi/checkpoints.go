package httpapi

// checkpointRoutes registers the checkpoints routes.
func (s *Server) checkpointRoutes() {}
