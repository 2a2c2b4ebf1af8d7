// Package httpapi is drover's HTTP API: every capability as JSON routes,
// described by an OpenAPI 3.1 document derived from the Go types (huma),
// for agents written in other languages than Go.
//
// Sessions stand in for the lease a Go process keeps: a client creates one
// (POST /v1/sessions, an etcd lease), keeps it alive, and binds what it
// holds (locks, claims, registrations, quota slots) to it; when the client
// dies etcd frees all of it within the TTL. The server keeps no client
// state: any server in front of the same etcd serves any session.
//
// Errors are RFC 9457 problem documents ([Problem]); bodies that do not
// match the schema, unknown fields included, get 400 and change nothing.
// Every request is bounded in time ([Config].RequestTimeout): when etcd
// does not answer within it, the answer is a 503 with Retry-After.
// With an auth file ([LoadAuth]) every route but the health checks needs a
// bearer token, scoped to namespaces (the Drover-Namespace header) and a
// role.
package httpapi
