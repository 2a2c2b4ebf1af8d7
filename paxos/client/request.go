package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// answer is a node's answer.
type answer struct {
	endpoint string
	status   int
	body     []byte
	leader   string // the LeaderHeader, host:port
}

// maxAnswerBytes bounds an answer (a list of many locks).
const maxAnswerBytes = 64 << 20

func (a answer) decode(v any) error {
	if err := json.Unmarshal(a.body, v); err != nil {
		return fmt.Errorf("paxos: %s answered %d with a body that is not the API's JSON: %w", a.endpoint, a.status, err)
	}
	return nil
}

// err is the APIError of an answer.
func (a answer) err() error {
	var e ErrorResponse
	if json.Unmarshal(a.body, &e) != nil || e.Error == "" {
		e.Error = strings.TrimSpace(string(a.body))
	}
	return &APIError{Endpoint: a.endpoint, StatusCode: a.status, Message: e.Error}
}

// notHeld is the NotHeldError of a 409.
func (a answer) notHeld(id string, token uint64) error {
	var r ErrorResponse
	if err := a.decode(&r); err != nil {
		return err
	}
	return &NotHeldError{Lock: id, Token: token, Current: r.Holder}
}

// do sends a request, failing over from endpoint to endpoint, starting
// with the leader the last answer named (when it is an endpoint that did
// not fail in that call) or else the one that answered last. It moves on when a node cannot be
// reached, is stopping (502, 503) or found no quorum (504): a node cut off
// from the majority must not hold up a client that reaches the others.
// When ctx has a deadline, each attempt but the last gets an equal share
// of the time left, so a node that hangs costs its share only.
func (c *Client) do(ctx context.Context, method, path string, body any) (answer, error) {
	var key string
	if method != http.MethodGet {
		var b [16]byte
		_, _ = rand.Read(b[:])
		key = hex.EncodeToString(b[:])
	}
	start := int(c.next.Load())
	var (
		errs    []string
		timeout *answer
	)
	for i := range c.endpoints {
		n := (start + i) % len(c.endpoints)
		actx, cancel := ctx, context.CancelFunc(func() {})
		if dl, ok := ctx.Deadline(); ok && i < len(c.endpoints)-1 {
			actx, cancel = context.WithTimeout(ctx, time.Until(dl)/time.Duration(len(c.endpoints)-i))
		}
		ans, err := c.send(actx, c.endpoints[n], method, path, body, key)
		cancel()
		if err == nil && ans.status != http.StatusServiceUnavailable && ans.status != http.StatusBadGateway && ans.status != http.StatusGatewayTimeout {
			c.next.Store(uint32(c.leaderOr(ans.leader, n)))
			return ans, nil
		}
		if ctx.Err() != nil {
			return answer{}, fmt.Errorf("paxos: %s %s: %w", method, path, context.Cause(ctx))
		}
		c.failed[n].Store(time.Now().UnixNano())
		if err == nil {
			if ans.status == http.StatusGatewayTimeout {
				timeout = &ans
			}
			err = ans.err()
		}
		errs = append(errs, err.Error())
	}
	if timeout != nil {
		return *timeout, nil
	}
	return answer{}, fmt.Errorf("%w (%s %s): %s", ErrUnreachable, method, path, strings.Join(errs, "; "))
}

// leaderRetry is how long the client does not follow a node's word that
// the leader is an endpoint that failed it: the other nodes may name a
// leader that this client cannot reach (or that just died) for a while.
const leaderRetry = 5 * time.Second

// leaderOr is the index of the endpoint at leader (host:port, as a node
// names it in LeaderHeader), or n if none is, or if that endpoint failed
// a request in the last leaderRetry: the next request goes straight to
// the leader when the client knows it by that address and reaches it.
func (c *Client) leaderOr(leader string, n int) int {
	if leader == "" {
		return n
	}
	for i, h := range c.hosts {
		if h == leader {
			if time.Since(time.Unix(0, c.failed[i].Load())) < leaderRetry {
				return n
			}
			return i
		}
	}
	return n
}

// send makes one request to one endpoint.
func (c *Client) send(ctx context.Context, endpoint, method, path string, body any, key string) (answer, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return answer{}, fmt.Errorf("paxos: encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, endpoint+path, rd)
	if err != nil {
		return answer{}, fmt.Errorf("paxos: %s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set(IdempotencyHeader, key)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the method and URL are said here
		}
		return answer{}, fmt.Errorf("paxos: %s %s%s: %w", method, endpoint, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return answer{}, fmt.Errorf("paxos: read answer of %s %s%s: %w", method, endpoint, path, err)
	}
	return answer{endpoint: endpoint, status: resp.StatusCode, body: b, leader: resp.Header.Get(LeaderHeader)}, nil
}
