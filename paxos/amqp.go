package paxos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultAMQPExchange is the topic exchange nodes meet on when
// AMQPConfig.Exchange is empty.
const DefaultAMQPExchange = "paxos_locks"

// Tuning of the RabbitMQ transport.
const (
	amqpOutboundQueue = 4096 // messages queued for the publisher; past it Send drops
	amqpMaxInFlight   = 1024 // publishes awaiting a confirm; past it the publisher waits
	amqpPrefetch      = 256  // consumer Qos: deliveries sent before an ack is seen
	// amqpAckBatch: one multiple-ack at least every this many deliveries,
	// or as soon as no further delivery is waiting.
	amqpAckBatch = amqpPrefetch / 4
	// amqpQueueMaxLength caps a node's queue on the broker: past it the
	// oldest messages are dropped, which Paxos tolerates.
	amqpQueueMaxLength = 10000
	amqpRecvBuffer     = 1024 // capacity of Recv

	amqpHeartbeat        = 5 * time.Second
	amqpHandshakeTimeout = 10 * time.Second
	amqpCloseTimeout     = 2 * time.Second
	amqpBackoffMin       = 100 * time.Millisecond
	amqpBackoffMax       = 5 * time.Second
)

// ErrBrokerUnreachable is wrapped by DialAMQP's error when no session
// with the broker could be set up: refused or timed-out connection,
// rejected credentials, unknown vhost.
var ErrBrokerUnreachable = errors.New("paxos: cannot connect to RabbitMQ")

var errAMQPClosed = errors.New("paxos: amqp transport closed")

// AMQPConfig configures a RabbitMQ transport. Zero values take defaults.
type AMQPConfig struct {
	// URL of the broker, amqp://user:password@host:port/vhost (amqps://
	// for TLS).
	URL string
	// Exchange is the topic exchange nodes publish to. Default
	// DefaultAMQPExchange ("paxos_locks").
	Exchange string
	// Group names the Paxos group; it prefixes every routing key, so
	// several groups share one exchange without seeing each other's
	// messages. Default "drover". It may not contain '.', '*', '#' or
	// spaces.
	Group string
	// ID is this node.
	ID NodeID
	// Logger receives connection events and delivery failures. Default:
	// discard.
	Logger *slog.Logger
}

// Validate reports whether c is usable (an empty Group is the default,
// so valid).
func (c *AMQPConfig) Validate() error {
	if c.URL == "" {
		return errors.New("paxos: amqp: URL is empty (want amqp://user:password@host:5672/)")
	}
	if _, err := amqp.ParseURI(c.URL); err != nil {
		return fmt.Errorf("paxos: amqp: bad URL: %w", err)
	}
	if strings.ContainsAny(c.Group, ".*# \t\r\n") {
		return fmt.Errorf("paxos: amqp: group %q may not contain '.', '*', '#' or spaces (it is part of routing keys)", c.Group)
	}
	return nil
}

func (c AMQPConfig) withDefaults() AMQPConfig {
	if c.Exchange == "" {
		c.Exchange = DefaultAMQPExchange
	}
	if c.Group == "" {
		c.Group = "drover"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// AMQPStats counts what a RabbitMQ transport did since it was dialed.
// Dropped messages never reached the broker (outbound queue full, publish
// failed, still queued at Close). Unconfirmed publishes lost their
// connection before the broker confirmed or refused them: they may or may
// not have arrived. Returned publishes found no queue bound for their
// routing key: the addressed node was not connected. Discarded
// deliveries were undecodable, of another group, or for another node.
type AMQPStats struct {
	Sent            uint64 `json:"sent"`             // published
	Dropped         uint64 `json:"dropped"`          // never published
	Confirmed       uint64 `json:"confirmed"`        // acked by the broker
	Nacked          uint64 `json:"nacked"`           // refused by the broker
	Unconfirmed     uint64 `json:"unconfirmed"`      // fate unknown
	Returned        uint64 `json:"returned"`         // unroutable
	Received        uint64 `json:"received"`         // handed to Recv
	Discarded       uint64 `json:"discarded"`        // dropped on arrival
	Reconnects      uint64 `json:"reconnects"`       // sessions set up again
	ReconnectErrors uint64 `json:"reconnect_errors"` // failed attempts at that
	Connected       bool   `json:"connected"`        // a session is up now
}

// AMQPTransport carries a group's messages over a RabbitMQ topic
// exchange (not durable, as in the original design; declared again on
// every reconnect, with the queue and its binding). Each node consumes
// from one exclusive, auto-delete queue bound to "<group>.node.<id>";
// Send publishes to "<group>.node.<to>", so replies are not broadcast.
//
// Send never blocks: a bounded queue feeds one publisher goroutine, which
// publishes in confirm mode and counts confirms asynchronously (up to
// 1024 in flight). Nacked and unconfirmed publishes are logged and
// counted, not retried: Paxos retries at its own level. Deliveries are
// acked manually in batches (one multiple-ack per 64, or as soon as none
// is waiting) under a prefetch of 256, which bounds what the client
// buffers; with auto-ack the broker would push the whole queue.
type AMQPTransport struct {
	cfg  AMQPConfig
	log  *slog.Logger
	url  string // redacted: no password
	key  string // own routing key and queue name
	out  chan amqpOutgoing
	recv chan Message

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once

	current atomic.Pointer[amqpSession] // nil while disconnected

	sent, dropped, confirmed, nacked, unconfirmed atomic.Uint64
	returned, received, discarded, reconnects     atomic.Uint64
	reconnectErrors                               atomic.Uint64
}

type amqpOutgoing struct {
	key  string
	typ  string
	body []byte
}

// DialAMQP connects to the broker, declares the exchange, this node's
// queue and its binding, and starts delivering. ctx bounds the first
// connection only; afterwards the transport reconnects on its own until
// Close. An unreachable broker gives an error wrapping
// ErrBrokerUnreachable that names the URL (without its password).
func DialAMQP(ctx context.Context, cfg AMQPConfig) (*AMQPTransport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	t := &AMQPTransport{
		cfg:  cfg,
		url:  redactAMQPURL(cfg.URL),
		key:  amqpRoutingKey(cfg.Group, cfg.ID),
		out:  make(chan amqpOutgoing, amqpOutboundQueue),
		recv: make(chan Message, amqpRecvBuffer),
	}
	t.log = cfg.Logger.With("transport", "amqp", "group", cfg.Group, "node", uint64(cfg.ID))
	s, err := t.connect(ctx)
	if err != nil {
		return nil, err
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.start(s)
	t.wg.Add(1)
	go t.run(s)
	t.log.Info("paxos: connected to RabbitMQ", "url", t.url, "exchange", cfg.Exchange, "queue", t.key)
	return t, nil
}

func amqpRoutingKey(group string, id NodeID) string {
	return group + ".node." + strconv.FormatUint(uint64(id), 10)
}

func redactAMQPURL(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return u.Redacted()
	}
	return "(unparsable URL)"
}

// Send queues m for node m.To and returns at once. It stamps m.Group
// when empty. A full outbound queue drops m (counted in Stats) and says
// so in the error.
func (t *AMQPTransport) Send(m Message) error {
	if t.ctx.Err() != nil {
		return errAMQPClosed
	}
	if m.Group == "" {
		m.Group = t.cfg.Group
	} else if m.Group != t.cfg.Group {
		return fmt.Errorf("paxos: amqp send %s: message of group %q on a transport of group %q", m.Type, m.Group, t.cfg.Group)
	}
	b, err := Encode(m)
	if err != nil {
		return err
	}
	select {
	case t.out <- amqpOutgoing{key: amqpRoutingKey(t.cfg.Group, m.To), typ: m.Type.String(), body: b}:
		return nil
	default:
		t.dropped.Add(1)
		return fmt.Errorf("paxos: amqp send %s to node %d: outbound queue full (%d), message dropped", m.Type, m.To, amqpOutboundQueue)
	}
}

// Recv is the stream of messages addressed to this node. Only Close
// closes it; it stays open across reconnects.
func (t *AMQPTransport) Recv() <-chan Message { return t.recv }

// SetPeers is a no-op: nodes reach each other through the exchange by id.
func (t *AMQPTransport) SetPeers([]Peer) {}

// Close stops the transport: it cancels the reconnect loop, closes the
// broker connection (the exclusive queue goes with it), waits for the
// publisher, consumer and confirm goroutines to end, and only then closes
// Recv. Messages still queued for publishing are dropped (counted).
// Safe to call more than once.
func (t *AMQPTransport) Close() error {
	t.once.Do(func() {
		t.cancel()
		if s := t.current.Load(); s != nil {
			// Bounds a publish stuck on a blocked broker.
			_ = s.raw.SetWriteDeadline(time.Now().Add(amqpCloseTimeout))
		}
		t.wg.Wait()
		close(t.recv)
		t.dropped.Add(uint64(len(t.out)))
	})
	return nil
}

// Stats returns the transport's counters.
func (t *AMQPTransport) Stats() AMQPStats {
	return AMQPStats{
		Sent: t.sent.Load(), Dropped: t.dropped.Load(),
		Confirmed: t.confirmed.Load(), Nacked: t.nacked.Load(), Unconfirmed: t.unconfirmed.Load(),
		Returned: t.returned.Load(), Received: t.received.Load(), Discarded: t.discarded.Load(),
		Reconnects: t.reconnects.Load(), ReconnectErrors: t.reconnectErrors.Load(), Connected: t.current.Load() != nil,
	}
}

// connect opens a connection and sets up the topology. ctx bounds the
// TCP dial and the AMQP handshake.
func (t *AMQPTransport) connect(ctx context.Context) (*amqpSession, error) {
	s := &amqpSession{dead: make(chan struct{}), inflight: make(chan struct{}, amqpMaxInFlight)}
	var stopWatch func() bool
	cfg := amqp.Config{
		Heartbeat: amqpHeartbeat,
		Properties: amqp.Table{
			"connection_name": fmt.Sprintf("drover paxos %s node %d", t.cfg.Group, t.cfg.ID),
			"product":         "drover",
		},
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: amqpHandshakeTimeout, KeepAlive: 15 * time.Second}
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			deadline := time.Now().Add(amqpHandshakeTimeout)
			if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
				deadline = dl
			}
			_ = c.SetDeadline(deadline)
			// Cancelling ctx cuts the handshake short.
			stopWatch = context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
			s.raw = c
			return c, nil
		},
	}
	conn, err := amqp.DialConfig(t.cfg.URL, cfg)
	if stopWatch != nil {
		stopWatch()
	}
	if err == nil && ctx.Err() != nil {
		_ = conn.Close()
		err = ctx.Err()
	}
	if err != nil {
		if s.raw != nil { // a failed handshake may leave it open
			_ = s.raw.Close()
		}
		cerr := ctx.Err()
		if dl, ok := ctx.Deadline(); ok && cerr == nil && !time.Now().Before(dl) {
			cerr = context.DeadlineExceeded // the handshake deadline was ctx's
		}
		if cerr != nil && !errors.Is(err, cerr) {
			err = fmt.Errorf("%w: %w", err, cerr)
		}
		return nil, fmt.Errorf("%w at %s: %w; check that the broker is running there and that the URL's host, port, user, password and vhost are right",
			ErrBrokerUnreachable, t.url, err)
	}
	s.conn = conn
	s.closed = conn.NotifyClose(make(chan *amqp.Error, 1))
	if err := t.declare(s); err != nil {
		_ = conn.CloseDeadline(time.Now().Add(amqpCloseTimeout))
		return nil, err
	}
	return s, nil
}

// declare sets up the exchange, the queue, its binding and the consumer
// on one channel, and a confirm-mode channel for publishing.
func (t *AMQPTransport) declare(s *amqpSession) error {
	ex := t.cfg.Exchange
	var err error
	if s.sub, err = s.conn.Channel(); err != nil {
		return fmt.Errorf("paxos: amqp: open channel: %w", err)
	}
	if err := s.sub.ExchangeDeclare(ex, "topic", false, false, false, false, nil); err != nil {
		return fmt.Errorf("paxos: amqp: declare topic exchange %q: %w (if it exists with other settings, delete it or set another exchange)", ex, err)
	}
	args := amqp.Table{"x-max-length": int32(amqpQueueMaxLength)}
	if _, err := s.sub.QueueDeclare(t.key, false, true, true, false, args); err != nil {
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.ResourceLocked {
			return fmt.Errorf("paxos: amqp: queue %q is held by another connection: is another node running as node %d of group %q? %w",
				t.key, t.cfg.ID, t.cfg.Group, err)
		}
		return fmt.Errorf("paxos: amqp: declare queue %q: %w", t.key, err)
	}
	if err := s.sub.QueueBind(t.key, t.key, ex, false, nil); err != nil {
		return fmt.Errorf("paxos: amqp: bind queue %q to %q: %w", t.key, ex, err)
	}
	if err := s.sub.Qos(amqpPrefetch, 0, false); err != nil {
		return fmt.Errorf("paxos: amqp: set prefetch: %w", err)
	}
	if s.deliveries, err = s.sub.Consume(t.key, "", false, true, false, false, nil); err != nil {
		return fmt.Errorf("paxos: amqp: consume %q: %w", t.key, err)
	}
	if s.pub, err = s.conn.Channel(); err != nil {
		return fmt.Errorf("paxos: amqp: open channel: %w", err)
	}
	if err := s.pub.Confirm(false); err != nil {
		return fmt.Errorf("paxos: amqp: confirm mode: %w", err)
	}
	s.confirms = s.pub.NotifyPublish(make(chan amqp.Confirmation, amqpMaxInFlight))
	s.returns = s.pub.NotifyReturn(make(chan amqp.Return, 64))
	s.subClosed = s.sub.NotifyClose(make(chan *amqp.Error, 1))
	s.pubClosed = s.pub.NotifyClose(make(chan *amqp.Error, 1))
	return nil
}
