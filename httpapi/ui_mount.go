package httpapi

import (
	"net/http"

	"github.com/droverhq/drover/ui"
)

// mountUI serves the dashboard at /ui/ (package ui): static files only,
// without a token, since they hold no data; the pages read everything
// through the API's routes with the token the user gives them. / and /ui
// redirect to it.
func (s *Server) mountUI() {
	s.mux.Handle("GET /ui/", http.StripPrefix("/ui", ui.Handler()))
	s.mux.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusFound))
	s.mux.Handle("GET /{$}", http.RedirectHandler("/ui/", http.StatusFound))
}
