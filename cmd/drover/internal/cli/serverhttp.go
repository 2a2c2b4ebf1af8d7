package cli

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/httpapi"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// defaultRequestTimeout is --http-request-timeout's default.
const defaultRequestTimeout = httpapi.DefaultRequestTimeout

// httpFlags are the server's flags for the HTTP API.
type httpFlags struct {
	listen   string
	authFile string
	tlsCert  string
	tlsKey   string
	insecure bool
	// requestTimeout bounds each request's time (httpapi.Config.RequestTimeout).
	requestTimeout time.Duration

	auth *httpapi.Auth // loaded by check
}

// check validates the HTTP flags and loads the auth file, before anything
// starts: the server refuses to listen beyond loopback without auth unless
// --insecure says the network is trusted.
func (h *httpFlags) check() error {
	if h.listen == "" {
		for flag, v := range map[string]string{"--auth-file": h.authFile, "--tls-cert": h.tlsCert, "--tls-key": h.tlsKey} {
			if v != "" {
				return usageError{fmt.Errorf("%s needs --http-listen: without it the server serves no HTTP API", flag)}
			}
		}
		return nil
	}
	if h.requestTimeout < 0 || (h.requestTimeout > 0 && h.requestTimeout < httpapi.MinRequestTimeout) {
		return &drover.InputError{Field: "--http-request-timeout", Value: h.requestTimeout.String(), Rule: "must be a duration of 100ms or more, such as 5s"}
	}
	host, _, err := net.SplitHostPort(h.listen)
	if err != nil {
		return &drover.InputError{Field: "--http-listen", Value: h.listen, Rule: "must be host:port, such as 127.0.0.1:8080"}
	}
	if (h.tlsCert == "") != (h.tlsKey == "") {
		return &drover.InputError{Field: "--tls-cert", Value: h.tlsCert, Rule: "needs --tls-key, and the other way round"}
	}
	if h.tlsCert != "" {
		if _, err := tls.LoadX509KeyPair(h.tlsCert, h.tlsKey); err != nil {
			return usageError{fmt.Errorf("--tls-cert %s with --tls-key %s: %w; give a PEM certificate and its private key", h.tlsCert, h.tlsKey, err)}
		}
	}
	if h.authFile != "" {
		if h.auth, err = httpapi.LoadAuth(h.authFile); err != nil {
			return usageError{err}
		}
	}
	if h.auth == nil && !h.insecure && !loopback(host) {
		return usageError{fmt.Errorf("refusing to serve the HTTP API on %s without --auth-file: anyone who reaches it could take locks, "+
			"claim tasks and purge queues; give --auth-file FILE (tokens with namespaces and roles), listen on 127.0.0.1, "+
			"or pass --insecure if the network is trusted", h.listen)}
	}
	return nil
}

// loopback reports whether host is a loopback name or address (an empty
// host listens everywhere).
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// startHTTP serves the HTTP API on the flags' address over cli until the
// returned stop is called; without --http-listen it does nothing.
func (a *app) startHTTP(h *httpFlags, cli *clientv3.Client) (stop func(), err error) {
	if h.listen == "" {
		return func() {}, nil
	}
	paxosEndpoints := strings.FieldsFunc(getenv(EnvPaxosEndpoints), func(r rune) bool { return r == ',' || r == ' ' })
	s, err := httpapi.New(httpapi.Config{Etcd: cli, Namespace: a.namespace, Auth: h.auth, Logger: a.logger,
		PaxosEndpoints: paxosEndpoints, RequestTimeout: h.requestTimeout})
	if err != nil {
		if len(paxosEndpoints) > 0 {
			return nil, usageError{fmt.Errorf("$%s (the Paxos group the dashboard shows): %w; give HOST:PORT,HOST:PORT of the nodes' APIs, or unset it", EnvPaxosEndpoints, err)}
		}
		return nil, err
	}
	l, err := net.Listen("tcp", h.listen)
	if err != nil {
		return nil, usageError{fmt.Errorf("the HTTP API cannot listen on %s: %w; pick another --http-listen", h.listen, err)}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := s.Serve(l, h.tlsCert, h.tlsKey); err != nil {
			a.logger.Error("HTTP API failed", "err", err)
		}
	}()
	scheme := "http"
	if h.tlsCert != "" {
		scheme = "https"
	}
	a.logger.Info("HTTP API ready", "url", fmt.Sprintf("%s://%s", scheme, l.Addr()), "auth", h.auth != nil, "openapi", "/openapi.json",
		"dashboard", fmt.Sprintf("%s://%s/ui/", scheme, l.Addr()))
	var once sync.Once
	return func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := s.Close(ctx); err != nil {
				a.logger.Warn("HTTP API did not stop in time", "err", err)
			}
			<-done
		})
	}, nil
}

// embeddedClient is the HTTP API's client of the embedded server: in
// process, without gRPC (cluster.Server.LocalClient). A linearizable read
// first, so that a server that cannot answer fails here.
func embeddedClient(ctx context.Context, srv *cluster.Server) (*clientv3.Client, error) {
	cli := srv.LocalClient()
	cctx, cancel := context.WithTimeout(ctx, cluster.DefaultDialTimeout)
	defer cancel()
	if _, err := cli.Get(cctx, "/", clientv3.WithCountOnly()); err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("HTTP API: the embedded etcd does not answer: %w", err)
	}
	return cli, nil
}
