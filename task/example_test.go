package task_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/droverhq/drover/task"
)

// A task made of steps: the runner takes the task's lock, resumes after the
// last checkpoint, and writes each checkpoint fenced by the lock's token.
// The second run finds the task completed and runs nothing.
func ExampleRunner() {
	ctx := context.Background()
	cli, err := newExampleClient()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	r, err := task.NewRunner(ctx, cli, task.RunnerConfig{Namespace: fmt.Sprintf("example-%d", time.Now().UnixNano()), WorkerID: "worker-1", TTL: 5 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer r.Close(ctx)

	step := func(name string) task.Step {
		return task.Step{Name: name, Run: func(ctx context.Context, state []byte) ([]byte, error) {
			// ctx is cancelled if this worker loses the task: pass it to
			// the LLM call.
			return append(state, strings.ToLower(name)+";"...), nil
		}}
	}
	steps := []task.Step{step("Ingest"), step("Analyze"), step("Report")}

	res, err := r.Run(ctx, "report-42", steps)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("resumed from step %d, ran %d steps, state %s\n", res.ResumedFrom, res.StepsRun, res.State)

	res, _ = r.Run(ctx, "report-42", steps)
	fmt.Println("second run, already completed:", res.AlreadyCompleted)

	hist, _ := r.Store().History(ctx, "report-42")
	for _, rec := range hist {
		fmt.Printf("step %d %s by %s\n", rec.Step, rec.Name, rec.Worker)
	}
	// Output:
	// resumed from step 1, ran 3 steps, state ingest;analyze;report;
	// second run, already completed: true
	// step 1 Ingest by worker-1
	// step 2 Analyze by worker-1
	// step 3 Report by worker-1
}
