package httpapi

// registryRoutes registers the registry routes.
func (s *Server) registryRoutes() {}
