package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/stream"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// emitEnv are the variables an exec handler's command finds its stream
// by: the worker sets them (queue.ExecHandler, workerHandler).
var emitEnv = []string{"DROVER_TASK_ID", "DROVER_QUEUE", "DROVER_CLAIM_TOKEN"}

func (a *app) emitCommand() *cobra.Command {
	var typ, data, text string
	cmd := &cobra.Command{
		Use:   "emit [--type T] [--data JSON | --text S]",
		Short: "Append an event to the stream of the task an exec handler or step runs",
		Long: `Append an event to the stream of the task that the exec handler running
this command handles: drover worker --handler 'exec:...' sets DROVER_TASK_ID,
DROVER_QUEUE and DROVER_CLAIM_TOKEN (and the etcd endpoints and namespace)
in its environment. In a step of drover task run, which sets DROVER_TASK_ID
and DROVER_LOCK_TOKEN, the event goes to that task's stream, under its lock. The event is stored under the task's claim: once the
claim is lost (the worker died, the task was taken over) the command fails
with exit 70 and nothing is stored. Followers see it at once (drover tasks
follow ID, GET /v1/tasks/{id}/stream).`,
		Example: `  drover emit --type progress --data '{"done": 3, "of": 12}'
  drover emit --type token --text 'Hel'
  drover emit --text 'fetched the page'   # type log, data {"text": "..."}`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			in, err := emitInput(cmd, typ, data, text)
			if err != nil {
				return err
			}
			return a.emit(cmd.Context(), in)
		},
	}
	cmd.Flags().StringVar(&typ, "type", "log", "the event's type (token, progress, log, ...)")
	cmd.Flags().StringVar(&data, "data", "", "the event's data: a JSON value")
	cmd.Flags().StringVar(&text, "text", "", `the event's data as text: {"text": S}`)
	return cmd
}

// emitInput reads emit's flags into an event.
func emitInput(cmd *cobra.Command, typ, data, text string) (stream.Input, error) {
	in := stream.Input{Type: typ}
	switch {
	case cmd.Flags().Changed("data") && cmd.Flags().Changed("text"):
		return in, usageError{errors.New("--data and --text cannot be used together: give one")}
	case cmd.Flags().Changed("data"):
		if !json.Valid([]byte(data)) {
			return in, &drover.InputError{Field: "--data", Value: data, Rule: `must be a JSON value ('{"done": 3}', '"text"', 42)`}
		}
		in.Data = json.RawMessage(data)
	case cmd.Flags().Changed("text"):
		b, _ := json.Marshal(map[string]string{"text": text})
		in.Data = b
	}
	return in, nil
}

// emit appends in to the stream of the task the environment names.
func (a *app) emit(ctx context.Context, in stream.Input) error {
	vals := map[string]string{}
	step := getenv("DROVER_QUEUE") == "" && getenv(EnvLockToken) != "" // a step of drover task run
	for _, k := range emitEnv {
		if vals[k] = getenv(k); vals[k] == "" && !(step && k != "DROVER_TASK_ID") {
			return usageError{fmt.Errorf("$%s is not set: drover emit runs inside an exec handler of drover worker, or a step of drover task run, which sets it", k)}
		}
	}
	token, err := strconv.ParseInt(vals["DROVER_CLAIM_TOKEN"], 10, 64)
	if !step && (err != nil || token < 1) {
		return usageError{fmt.Errorf("$DROVER_CLAIM_TOKEN is %q: not a claim's token", vals["DROVER_CLAIM_TOKEN"])}
	}
	if ns := getenv("DROVER_NAMESPACE"); ns != "" && a.namespace == keyspace.DefaultNamespace {
		a.namespace = ns
	}
	cli, c, done, err := a.streamClients(ctx)
	if err != nil {
		return err
	}
	defer done()
	h := queue.Held{Queue: vals["DROVER_QUEUE"], ID: vals["DROVER_TASK_ID"], Token: token}
	var claim stream.Claim
	if step {
		claim, err = stepClaim(ctx, cli, keyspace.MustNew(a.namespace), h.ID, getenv(EnvLockToken))
	} else {
		claim, err = c.StreamClaim(ctx, h)
	}
	if err == nil {
		_, _, err = stream.For(cli, keyspace.MustNew(a.namespace)).Append(ctx, claim, []stream.Input{in})
	}
	switch {
	case errors.Is(err, lease.ErrFenced):
		return withCode(ExitLockLost, fmt.Errorf("task %s: %w", h.ID, err))
	case errors.Is(err, stream.ErrStreamFull):
		return withCode(ExitBusy, err)
	}
	return err
}

func (a *app) tasksFollowCommand() *cobra.Command {
	var from int64
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "follow ID",
		Short: "Follow a task's stream: its events as they come, until it is done",
		Long: `Print a task's stream: every event stored from --from on, then each as it
is written, until the task's done event. It may start before the task
starts or after it ended (within the stream's retention). After a takeover
the next attempt's events follow an attempt_lost event.`,
		Example: `  drover tasks follow 7f3a91
  drover tasks follow 7f3a91 --from 120 --json | jq -r 'select(.type=="token") | .data.text'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if from < 0 {
				return &drover.InputError{Field: "--from", Value: from, Rule: "must be 0 or more"}
			}
			return a.follow(cmd.Context(), args[0], from, asJSON)
		},
	}
	cmd.Flags().Int64Var(&from, "from", 1, "start at this sequence number")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print each event as a JSON line")
	return cmd
}

// follow prints task id's stream from from until its done event.
func (a *app) follow(ctx context.Context, id string, from int64, asJSON bool) error {
	if err := keyspace.CheckName("ID", id); err != nil {
		return usageError{err}
	}
	cli, c, done, err := a.streamClients(ctx)
	if err != nil {
		return err
	}
	defer done()
	keys := keyspace.MustNew(a.namespace)
	if _, err := c.Get(ctx, id); errors.Is(err, queue.ErrNotFound) {
		r, err := cli.Get(ctx, keys.StreamChunks(id), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return err
		}
		if r.Count == 0 && !agentTaskKnown(ctx, cli, a.namespace, id) {
			return withCode(ExitFailure, fmt.Errorf("task %s: no such task, and no stream", id))
		}
	} else if err != nil {
		return err
	}
	enc := json.NewEncoder(a.stdout)
	// A task that ended without a done (a cancel of a task waiting to
	// run again) ends its follower too.
	for ev, err := range stream.HubFor(cli, keys).Follow(ctx, id, from, endsStream(c, cli, a.namespace, id)) {
		if err != nil {
			return err
		}
		if asJSON {
			if err := enc.Encode(ev); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(a.stdout, "%d\tattempt %d\t%s\t%s\n", ev.Seq, ev.Attempt, ev.Type, ev.Data)
	}
	return nil
}

// streamClients connects, and returns the etcd client, a queue client
// and their closer.
func (a *app) streamClients(ctx context.Context) (*clientv3.Client, *queue.Client, func(), error) {
	cli, done, err := a.etcd(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	c, err := queue.NewClient(cli, a.namespace)
	if err != nil {
		done()
		return nil, nil, nil, usageError{err}
	}
	return cli, c, done, nil
}

// closeStreams closes the process's stream writers and hubs of cli
// (stream.CloseAll) before cli closes: the events emitted are sent and
// the follows end; bounded by 10 s.
func (a *app) closeStreams(cli *clientv3.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := stream.CloseAll(ctx, cli); err != nil {
		a.logger.Warn("streams closed without their goroutines ending", "err", err)
	}
}
