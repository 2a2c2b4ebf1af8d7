package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/droverhq/drover/paxos"
)

// paxosServe runs a node until a signal; see the serve command's help for
// the shutdown order.
func (a *app) paxosServe(ctx context.Context, cfg paxosServeConfig) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return usageError{fmt.Errorf("--listen %s: %w; another process listens there: stop it or choose another --listen", cfg.listen, err)}
	}
	defer ln.Close()
	cfg.node.Logger = a.logger
	direct, err := a.paxosTransport(ctx, &cfg)
	if err != nil {
		return err
	}
	defer cfg.node.Transport.Close()
	// The listener serves the peer stream from now on (the probe's
	// answers come in through it), and 503 until the node runs.
	h := &paxosHandler{direct: direct}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	node, err := a.paxosStartNode(ctx, cfg)
	if err != nil || node == nil {
		_ = srv.Close()
		return err
	}
	defer node.Stop()
	api := paxos.NewAPI(node, paxos.APIConfig{RequestTimeout: cfg.reqTimeout, Direct: direct, Logger: a.logger})
	h.api.Store(&api)
	transport := "direct"
	if cfg.amqpURL != nil {
		transport = cfg.amqpURL.Redacted()
	}
	a.logger.Info("paxos node ready", "id", cfg.node.ID, "group", cfg.node.Group, "listen", ln.Addr().String(),
		"transport", transport, "members", len(cfg.node.Peers), "data_dir", cfg.node.DataDir)
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-served:
	}
	a.logger.Info("paxos node stopping", "id", cfg.node.ID)
	// 1. drain the API, 2. stop the node, 3. close the transport.
	sctx, cancel := context.WithTimeout(context.Background(), cfg.reqTimeout+time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	if err := node.Stop(); err != nil {
		a.logger.Warn("paxos node did not stop cleanly", "err", err)
	}
	if err := cfg.node.Transport.Close(); err != nil {
		a.logger.Warn("paxos transport did not close cleanly", "err", err)
	}
	a.logger.Info("paxos node stopped", "id", cfg.node.ID)
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("paxos API on %s: %w", cfg.listen, serveErr)
	}
	return nil
}

// paxosTransport sets cfg.node.Transport: the direct transport (whose
// stream handler it returns) or RabbitMQ.
func (a *app) paxosTransport(ctx context.Context, cfg *paxosServeConfig) (http.Handler, error) {
	if cfg.amqpURL == nil {
		d := paxos.NewDirect(paxos.DirectConfig{ID: cfg.node.ID, Group: cfg.node.Group, Logger: a.logger})
		cfg.node.Transport = d
		return d.Handler(), nil
	}
	dctx, cancel := context.WithTimeout(ctx, a.dialTimeout)
	t, err := paxos.DialAMQP(dctx, paxos.AMQPConfig{URL: cfg.amqpURL.String(), Group: cfg.node.Group, ID: cfg.node.ID, Logger: a.logger})
	cancel()
	switch {
	case errors.Is(err, paxos.ErrBrokerUnreachable):
		return nil, withCode(ExitUnavailable, fmt.Errorf("%w (tried for %s; the URL is --transport, else $%s)", err, a.dialTimeout, EnvRabbitMQURL))
	case err != nil:
		return nil, usageError{fmt.Errorf("--transport %s: %w", cfg.amqpURL.Redacted(), err)}
	}
	cfg.node.Transport = t
	return nil, nil
}

// paxosStartNode checks that a node on a new data dir may found the
// group (see paxos.ProbeGroup), then opens its data dir and starts it. A
// nil node with a nil error means a signal came first.
func (a *app) paxosStartNode(ctx context.Context, cfg paxosServeConfig) (*paxos.Node, error) {
	isNew, err := paxos.DataDirIsNew(cfg.node.DataDir)
	if err != nil {
		return nil, usageError{fmt.Errorf("--data-dir %s: cannot open this node's state: %w", cfg.node.DataDir, err)}
	}
	if isNew && !cfg.join {
		rep, err := paxos.ProbeGroup(ctx, paxos.ProbeConfig{ID: cfg.node.ID, Group: cfg.node.Group, Peers: cfg.node.Peers,
			Transport: cfg.node.Transport, Logger: a.logger})
		if err != nil {
			return nil, usageError{fmt.Errorf("--data-dir %s is new and --peers lists node %d: %w", cfg.node.DataDir, cfg.node.ID, err)}
		}
		a.logger.Info("paxos: new data dir; the group has no state yet", "answered", len(rep.Answered), "of", len(cfg.node.Peers)-1)
		if ctx.Err() != nil {
			return nil, nil
		}
	}
	node, err := paxos.NewNode(cfg.node)
	if err != nil {
		if errors.Is(err, paxos.ErrWrongGroup) || errors.Is(err, paxos.ErrDataDirInUse) {
			return nil, usageError{fmt.Errorf("--data-dir %s: %w", cfg.node.DataDir, err)}
		}
		return nil, usageError{fmt.Errorf("--data-dir %s: cannot open this node's state: %w", cfg.node.DataDir, err)}
	}
	if err := node.Start(context.WithoutCancel(ctx)); err != nil {
		_ = node.Stop()
		return nil, fmt.Errorf("start paxos node %d: %w", cfg.node.ID, err)
	}
	return node, nil
}

// paxosHandler serves the peer stream at once and the API once the node
// runs (503 before).
type paxosHandler struct {
	direct http.Handler
	api    atomic.Pointer[http.Handler]
}

func (h *paxosHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if api := h.api.Load(); api != nil {
		(*api).ServeHTTP(w, r)
		return
	}
	if h.direct != nil && r.URL.Path == paxos.DirectStreamPath {
		h.direct.ServeHTTP(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = w.Write([]byte(`{"error":"this node is starting: send requests to another node"}` + "\n"))
}
