package paxos

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// amqpSession is one connection to the broker with its two channels.
type amqpSession struct {
	conn       *amqp.Connection
	raw        net.Conn
	sub, pub   *amqp.Channel
	deliveries <-chan amqp.Delivery
	confirms   chan amqp.Confirmation
	returns    chan amqp.Return
	// closed is the connection's close notice; subClosed and pubClosed
	// are its channels'.
	closed, subClosed, pubClosed chan *amqp.Error
	inflight                     chan struct{} // a token per unconfirmed publish

	published uint64        // owned by the run goroutine
	settled   atomic.Uint64 // confirms and nacks seen
	dead      chan struct{}
	killOnce  sync.Once
	wg        sync.WaitGroup
}

func (s *amqpSession) kill() { s.killOnce.Do(func() { close(s.dead) }) }

// start launches a session's consumer and confirm tracker and makes it
// current.
func (t *AMQPTransport) start(s *amqpSession) {
	s.wg.Add(3)
	go t.watch(s)
	go t.consume(s)
	go t.track(s)
	t.current.Store(s)
}

// watch ends the session when the broker closes its connection or one
// of its channels.
func (t *AMQPTransport) watch(s *amqpSession) {
	defer s.wg.Done()
	defer s.kill()
	var what string
	var err *amqp.Error
	select {
	case err = <-s.closed:
		what = "connection"
	case err = <-s.subClosed:
		what = "consume channel"
	case err = <-s.pubClosed:
		what = "publish channel"
	case <-s.dead:
		return
	}
	if err != nil {
		t.log.Warn("paxos: RabbitMQ closed the "+what+"; reconnecting", "err", err)
	}
}

// run owns publishing: it serves one session at a time and reconnects
// when it dies, until Close.
func (t *AMQPTransport) run(s *amqpSession) {
	defer t.wg.Done()
	for s != nil {
		t.publishLoop(s)
		t.end(s)
		s = t.reconnect()
	}
}

func (t *AMQPTransport) publishLoop(s *amqpSession) {
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-s.dead:
			return
		case o := <-t.out:
			if !t.publish(s, o) {
				return
			}
		}
	}
}

// publish sends one message once a confirm slot is free. It reports
// false when the session is unusable.
func (t *AMQPTransport) publish(s *amqpSession, o amqpOutgoing) bool {
	select {
	case s.inflight <- struct{}{}:
	case <-s.dead:
		t.dropped.Add(1)
		return false
	case <-t.ctx.Done():
		t.dropped.Add(1)
		return false
	}
	err := s.pub.Publish(t.cfg.Exchange, o.key, true, false, amqp.Publishing{
		ContentType: "application/json", DeliveryMode: amqp.Transient, Type: o.typ, AppId: "drover", Body: o.body,
	})
	if err != nil {
		<-s.inflight
		t.dropped.Add(1)
		t.log.Warn("paxos: amqp publish failed", "key", o.key, "err", err)
		s.kill()
		return false
	}
	s.published++
	t.sent.Add(1)
	return true
}

// track counts the broker's confirms and returns; it ends when the
// publishing channel closes.
func (t *AMQPTransport) track(s *amqpSession) {
	defer s.wg.Done()
	defer s.kill()
	confirms, returns := s.confirms, s.returns
	for confirms != nil || returns != nil {
		select {
		case c, ok := <-confirms:
			if !ok {
				confirms = nil
				s.kill()
				continue
			}
			s.settled.Add(1)
			select {
			case <-s.inflight:
			default:
			}
			if c.Ack {
				t.confirmed.Add(1)
			} else {
				t.nacked.Add(1)
				t.log.Warn("paxos: RabbitMQ refused a publish (nack)", "tag", c.DeliveryTag)
			}
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			t.returned.Add(1)
			t.log.Debug("paxos: message returned: no queue for its routing key", "key", r.RoutingKey, "type", r.Type)
		}
	}
}

// consume hands deliveries to Recv and acks them in batches.
func (t *AMQPTransport) consume(s *amqpSession) {
	defer s.wg.Done()
	defer s.kill()
	var last uint64
	pending := 0
	for {
		var d amqp.Delivery
		var ok bool
		if pending > 0 {
			select {
			case d, ok = <-s.deliveries:
			default:
				t.ack(s, last)
				pending = 0
				continue
			}
		} else {
			select {
			case d, ok = <-s.deliveries:
			case <-t.ctx.Done():
				return
			}
		}
		if !ok {
			return
		}
		if !t.deliver(s, d.Body) {
			return
		}
		last = d.DeliveryTag
		if pending++; pending >= amqpAckBatch {
			t.ack(s, last)
			pending = 0
		}
	}
}

func (t *AMQPTransport) ack(s *amqpSession, tag uint64) {
	if err := s.sub.Ack(tag, true); err != nil {
		t.log.Debug("paxos: amqp ack failed", "err", err)
		s.kill()
	}
}

// deliver decodes a delivery and hands it to Recv. It reports false when
// the transport is closing or the session died (its queue, and so this
// unacked delivery, went with the connection).
func (t *AMQPTransport) deliver(s *amqpSession, body []byte) bool {
	m, err := Decode(body)
	if err != nil || m.Group != t.cfg.Group || m.To != t.cfg.ID {
		t.discarded.Add(1)
		t.log.Warn("paxos: amqp: delivery dropped", "err", err, "msg_group", m.Group, "msg_to", uint64(m.To))
		return true
	}
	select {
	case t.recv <- m:
		t.received.Add(1)
		return true
	case <-t.ctx.Done():
		return false
	case <-s.dead:
		return false
	}
}

// end closes a session and waits for its goroutines. Publishes it never
// saw settled are counted as unconfirmed.
func (t *AMQPTransport) end(s *amqpSession) {
	t.current.Store(nil)
	s.kill()
	if err := s.conn.CloseDeadline(time.Now().Add(amqpCloseTimeout)); err != nil && !errors.Is(err, amqp.ErrClosed) {
		t.log.Debug("paxos: amqp close", "err", err)
		_ = s.raw.Close()
	}
	s.wg.Wait()
	if lost := s.published - s.settled.Load(); lost > 0 {
		t.unconfirmed.Add(lost)
		t.log.Warn("paxos: amqp publishes unconfirmed when the connection ended", "count", lost)
	}
}

// reconnect dials until it succeeds, with a doubling, jittered delay
// capped at amqpBackoffMax. It returns nil once Close was called.
func (t *AMQPTransport) reconnect() *amqpSession {
	delay := amqpBackoffMin
	for attempt := 1; t.ctx.Err() == nil; attempt++ {
		if !redialSleep(t.ctx, redialJitter(delay)) {
			return nil
		}
		ctx, cancel := context.WithTimeout(t.ctx, amqpHandshakeTimeout)
		s, err := t.connect(ctx)
		cancel()
		if err == nil {
			t.reconnects.Add(1)
			t.start(s)
			t.log.Info("paxos: reconnected to RabbitMQ", "url", t.url, "attempt", attempt)
			return s
		}
		if t.ctx.Err() == nil {
			t.reconnectErrors.Add(1)
			level := slog.LevelDebug // a long outage is not logged every try
			if attempt%12 == 1 {
				level = slog.LevelWarn
			}
			t.log.Log(t.ctx, level, "paxos: reconnect to RabbitMQ failed", "attempt", attempt, "err", err)
		}
		delay = min(2*delay, amqpBackoffMax)
	}
	return nil
}
