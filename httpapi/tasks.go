package httpapi

// taskRoutes registers the tasks routes.
func (s *Server) taskRoutes() {}
