package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	"os"
	"strings"
	"time"

	"github.com/droverhq/drover"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// EnvEndpoints is the environment variable that names etcd's endpoints when
// no flag does (comma-separated), as in NVIDIA Dynamo.
const EnvEndpoints = "ETCD_ENDPOINTS"

// DefaultEndpoint is used when neither a flag nor ETCD_ENDPOINTS names one.
const DefaultEndpoint = "127.0.0.1:2379"

// DefaultDialTimeout bounds how long Connect tries to reach etcd.
const DefaultDialTimeout = 5 * time.Second

// ErrUnreachable is matched by the error Connect returns when no endpoint
// answered within the dial timeout.
var ErrUnreachable = errors.New("cluster: etcd unreachable")

// UnreachableError says which endpoints were tried, for how long, and what to
// do next.
type UnreachableError struct {
	Endpoints []string
	Timeout   time.Duration
	Err       error
}

// Error implements error.
func (e *UnreachableError) Error() string {
	return fmt.Sprintf("cannot reach etcd at %s (tried for %s: %v): start `drover server` or set %s",
		strings.Join(e.Endpoints, ","), e.Timeout, e.Err, EnvEndpoints)
}

// Unwrap returns ErrUnreachable and the underlying cause.
func (e *UnreachableError) Unwrap() []error { return []error{ErrUnreachable, e.Err} }

// ClientConfig says how to reach etcd.
type ClientConfig struct {
	// Endpoints are host:port or URLs. Empty means [ResolveEndpoints]("").
	// Give every member of a cluster: the client spreads its requests over
	// them and goes on through the others when one stops answering.
	Endpoints []string
	// DialTimeout bounds the reachability check. Zero means 5 s.
	DialTimeout time.Duration
	// CACert, Cert and Key are PEM files for TLS to etcd: the CA that
	// signed the members' certificates, and the client's own certificate
	// and key (both, or neither). Any of them makes the connection TLS.
	CACert, Cert, Key string
	// Username and Password authenticate to an etcd with auth enabled.
	Username, Password string
}

// tls builds the client's TLS configuration; nil without TLS files.
func (c ClientConfig) tls() (*tls.Config, error) {
	if c.CACert == "" && c.Cert == "" && c.Key == "" {
		return nil, nil
	}
	if (c.Cert == "") != (c.Key == "") {
		return nil, &drover.InputError{Field: "--etcd-cert", Value: c.Cert, Rule: "needs --etcd-key, and the other way round"}
	}
	info := transport.TLSInfo{TrustedCAFile: c.CACert, CertFile: c.Cert, KeyFile: c.Key}
	cfg, err := info.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("cluster: TLS to etcd (--etcd-cacert %q, --etcd-cert %q, --etcd-key %q): %w", c.CACert, c.Cert, c.Key, err)
	}
	return cfg, nil
}

// ResolveEndpoints picks the endpoints a command uses: the flag value when it
// names any (comma-separated), else ETCD_ENDPOINTS when it does, else
// 127.0.0.1:2379.
func ResolveEndpoints(flag string) []string {
	if eps := splitEndpoints(flag); len(eps) > 0 {
		return eps
	}
	if eps := splitEndpoints(os.Getenv(EnvEndpoints)); len(eps) > 0 {
		return eps
	}
	return []string{DefaultEndpoint}
}

func splitEndpoints(raw string) []string {
	var eps []string
	for _, e := range strings.Split(raw, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	return eps
}

// Connect returns a client to etcd once a linearizable read has gone through,
// so that a wrong address fails here, within cfg.DialTimeout, with an
// [UnreachableError], and not later in the middle of work.
func Connect(ctx context.Context, cfg ClientConfig) (*clientv3.Client, error) {
	if len(cfg.Endpoints) == 0 {
		cfg.Endpoints = ResolveEndpoints("")
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	tlsCfg, err := cfg.tls()
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            cfg.Endpoints,
		DialTimeout:          cfg.DialTimeout,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		Logger:               zap.NewNop(),
		TLS:                  tlsCfg,
		Username:             cfg.Username,
		Password:             cfg.Password,
	})
	if err != nil {
		return nil, &UnreachableError{Endpoints: cfg.Endpoints, Timeout: cfg.DialTimeout, Err: err}
	}
	cctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	// A user whose role covers only some keys (etcd auth) is refused the
	// read of "/": that refusal came from etcd, which is reachable.
	if _, err := cli.Get(cctx, "/", clientv3.WithCountOnly()); err != nil && !errors.Is(err, rpctypes.ErrPermissionDenied) {
		_ = cli.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("cluster: connect: %w", ctx.Err())
		}
		return nil, &UnreachableError{Endpoints: cfg.Endpoints, Timeout: cfg.DialTimeout, Err: err}
	}
	return cli, nil
}
