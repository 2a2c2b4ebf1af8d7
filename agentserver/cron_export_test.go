package agentserver

import (
	"context"
	"time"

	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// SetNewWorker makes r make its namespaces' workers with f.
func SetNewWorker(r *CronRunner, f func(context.Context, *clientv3.Client, queue.WorkerConfig) (*queue.Worker, error)) {
	r.newWorker = f
}

// FireCron makes the run of the fire that task taskID of cron id is in
// namespace ns, as CronRunner does, and answers what the fire did.
func FireCron(ctx context.Context, cli *clientv3.Client, ns, id, taskID string) (string, string, error) {
	out, err := FireCronOn(ctx, cli, ns, id, taskID)
	return out[0], out[1], err
}

// FireCronOn is FireCron answering the outcome, the run and its thread.
func FireCronOn(ctx context.Context, cli *clientv3.Client, ns, id, taskID string) ([3]string, error) {
	s := &server{cfg: Config{Etcd: cli, Namespace: func(context.Context) string { return ns }}}
	s.cfg.Now = time.Now
	out, err := s.fireCron(ctx, id, taskID)
	return [3]string{out.Outcome, out.RunID, out.ThreadID}, err
}

// CreateCronOn creates a cron of assistant with schedule in namespace ns
// through cli, as POST /runs/crons does, and answers its id.
func CreateCronOn(ctx context.Context, cli *clientv3.Client, ns, assistant, schedule string) (string, error) {
	s := &server{cfg: Config{Etcd: cli, Namespace: func(context.Context) string { return ns }, Now: time.Now}}
	c, err := s.newCron(ctx, "", cronBody{AssistantID: assistant, Schedule: schedule})
	return c.CronID, err
}

// DeleteThreadOn deletes thread th of namespace ns through cli, as
// DELETE /threads/{id} does.
func DeleteThreadOn(ctx context.Context, cli *clientv3.Client, ns, th string) error {
	s := &server{cfg: Config{Etcd: cli, Namespace: func(context.Context) string { return ns }, Now: time.Now}}
	return s.deleteThread(ctx, th)
}

// AwaitAdmitted waits, as a join or stream does, until run id of thread
// th of namespace ns is admitted.
func AwaitAdmitted(ctx context.Context, cli *clientv3.Client, ns, th, id string) error {
	s := &server{cfg: Config{Etcd: cli, Namespace: func(context.Context) string { return ns }, Now: time.Now}}
	return s.awaitAdmitted(ctx, th, id)
}

// DeleteRunCheckpointsOn deletes the checkpoints run id wrote on thread
// th of namespace ns, as a rollback does.
func DeleteRunCheckpointsOn(ctx context.Context, cli *clientv3.Client, ns, th, id string) error {
	s := &server{cfg: Config{Etcd: cli, Namespace: func(context.Context) string { return ns }, Now: time.Now}}
	sp, err := s.space(ctx)
	if err != nil {
		return err
	}
	return s.deleteRunCheckpoints(ctx, sp, th, id)
}
