// Package ui is drover's web dashboard: hand-written HTML, CSS and
// JavaScript embedded in the binary, with no build step and nothing loaded
// from the internet. The HTTP API serves it at /ui/ (package httpapi); the
// pages read and change everything through the API's own routes, with the
// user's bearer token (kept in the tab's sessionStorage), and follow GET
// /v1/events to update live.
//
//	mux.Handle("GET /ui/", http.StripPrefix("/ui", ui.Handler()))
//
// The files themselves are public: they hold no data. See docs/ui.md.
package ui
