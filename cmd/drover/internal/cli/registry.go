package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/process"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/registry"
	"github.com/spf13/cobra"
)

func (a *app) registryCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "registry",
		Short: "Register endpoints and discover them (lease-bound, watched)",
		Long: `Processes register endpoints under /{ns}/components/{component}/endpoints/{id},
bound to their primary lease: an endpoint disappears by itself when its process
dies (within the lease TTL) and at once when it stops. Others list or watch
them.`,
		Example: `  drover registry register VllmWorker --id gpu-0 --address 10.0.0.5:8000 --data '{"request_active_slots":0}'
  drover registry list VllmWorker --json
  drover registry watch --json`,
	}
	cmd.AddCommand(a.registryRegisterCommand(), a.registryListCommand(), a.registryWatchCommand())
	return cmd
}

func (a *app) registryRegisterCommand() *cobra.Command {
	var (
		ep         registry.Endpoint
		data       string
		ttl        time.Duration
		reRegister bool
		asJSON     bool
	)
	cmd := &cobra.Command{
		Use:   "register COMPONENT --id ID --address ADDR [--data JSON] [--ttl 10s]",
		Short: "Register an endpoint and hold it until interrupted",
		Long: `Register endpoint ID of COMPONENT, bound to this process's primary lease, and
hold it until SIGINT or SIGTERM, which revoke the lease so the endpoint
disappears at once. If the lease is lost (etcd unreachable past the TTL), the
endpoint is gone and the command exits 70, unless --reregister is given: then
it grants a new lease and registers again (it is invisible in between).

An id registered by another live process is refused (exit 2). --data must be
a JSON object (load figures such as request_active_slots).`,
		Example: `  drover registry register VllmWorker --id gpu-0 --address 10.0.0.5:8000 \
      --data '{"kv_active_blocks":0,"request_active_slots":0,"request_total_slots":100}'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.checkGlobal(); err != nil {
				return err
			}
			component := args[0]
			ep.Data = json.RawMessage(data)
			if err := checkRegistration(component, ep, ttl); err != nil {
				return err
			}
			return a.registerAndHold(cmd.Context(), component, ep, ttl, reRegister, asJSON)
		},
	}
	f := cmd.Flags()
	f.StringVar(&ep.ID, "id", "", "endpoint id (required)")
	f.StringVar(&ep.Address, "address", "", "address others reach the endpoint at (required)")
	f.StringVar(&ep.Subject, "subject", "", "subject (default {namespace}.{component}.{id})")
	f.StringVar(&data, "data", "", "JSON object: load figures and anything routers need")
	f.DurationVar(&ttl, "ttl", process.DefaultTTL, "primary lease TTL: a dead process's endpoint disappears after about this long")
	f.BoolVar(&reRegister, "reregister", false, "after a lease loss, grant a new lease and register again instead of exiting")
	f.BoolVar(&asJSON, "json", false, "print the registration as JSON")
	return cmd
}

// checkRegistration checks the arguments of drover registry register.
func checkRegistration(component string, ep registry.Endpoint, ttl time.Duration) error {
	if err := registry.CheckComponent("COMPONENT", component); err != nil {
		return err
	}
	if err := ep.Check(); err != nil {
		return flagError(err)
	}
	return drover.Rename(lease.CheckTTL("ttl", ttl), "--ttl")
}

// registerAndHold registers endpoint ep of component under a runtime's
// primary lease and holds it until SIGINT or SIGTERM, or until the
// registration ends.
func (a *app) registerAndHold(ctx context.Context, component string, ep registry.Endpoint, ttl time.Duration, reRegister, asJSON bool) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cli, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer cli.Close()
	opts := []process.Option{process.WithTTL(ttl), process.WithNamespace(a.namespace), process.WithLogger(a.logger)}
	if reRegister {
		opts = append(opts, process.WithReRegister())
	}
	rt, err := process.Start(ctx, cli, opts...)
	if err != nil {
		return err
	}
	defer shutdown(rt)
	reg, err := registry.Register(ctx, rt, component, ep)
	if err != nil {
		if errors.Is(err, registry.ErrDuplicate) {
			return withCode(ExitUsage, err)
		}
		return err
	}
	if asJSON {
		_ = json.NewEncoder(a.stdout).Encode(map[string]any{"registered": reg.Key(), "component": component, "id": ep.ID, "lease": fmt.Sprintf("%x", int64(rt.Lease().ID()))})
	} else {
		fmt.Fprintf(a.stdout, "registered %s/%s (lease %x, TTL %s); holding until interrupted\n", component, ep.ID, int64(rt.Lease().ID()), rt.Lease().TTL())
	}
	select {
	case <-ctx.Done():
		return nil
	case <-rt.Done():
		return withCode(ExitLeaseLost, fmt.Errorf("registration of %s/%s ended: %w", component, ep.ID, rt.Err()))
	case <-reg.Done():
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("registration of %s/%s ended: %w", component, ep.ID, reg.Err())
	}
}

// flagError renames an input error's field to its flag.
func flagError(err error) error {
	var ie *drover.InputError
	if errors.As(err, &ie) {
		switch ie.Field {
		case "endpoint id":
			return ie.Renamed("--id")
		case "address", "subject", "data":
			return ie.Renamed("--" + ie.Field)
		}
	}
	return err
}

// shutdown stops a runtime, revoking its lease, within 5 s.
func shutdown(rt *process.Runtime) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = rt.Shutdown(ctx)
}

// optionalComponent returns the COMPONENT argument, "" when absent.
func optionalComponent(args []string) (string, error) {
	if len(args) == 0 {
		return "", nil
	}
	return args[0], registry.CheckComponent("COMPONENT", args[0])
}

// listEndpoints connects and lists the endpoints of component ("" for all).
func (a *app) listEndpoints(ctx context.Context, component string) ([]registry.Instance, error) {
	cli, done, err := a.etcd(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	list, _, err := registry.List(ctx, cli, a.namespace, component)
	return list, err
}

// instanceJSON is how the CLI prints an endpoint.
type instanceJSON struct {
	Component      string            `json:"component"`
	ID             string            `json:"id"`
	Value          registry.Endpoint `json:"value"`
	Lease          string            `json:"lease"`
	CreateRevision int64             `json:"create_revision"`
	ModRevision    int64             `json:"mod_revision"`
}

func toJSON(in registry.Instance) instanceJSON {
	return instanceJSON{Component: in.Component, ID: in.ID, Value: in.Endpoint, Lease: fmt.Sprintf("%x", in.Lease), CreateRevision: in.CreateRevision, ModRevision: in.ModRevision}
}

func (a *app) registryListCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list [COMPONENT] [--json]",
		Short: "List registered endpoints",
		Example: `  drover registry list
  drover registry list VllmWorker --json | jq '.[].value.address'`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			component, err := optionalComponent(args)
			if err != nil {
				return err
			}
			list, err := a.listEndpoints(cmd.Context(), component)
			if err != nil {
				return err
			}
			if asJSON {
				out := make([]instanceJSON, 0, len(list))
				for _, in := range list {
					out = append(out, toJSON(in))
				}
				return json.NewEncoder(a.stdout).Encode(out)
			}
			if len(list) == 0 {
				fmt.Fprintln(a.stdout, "no endpoints registered")
				return nil
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "COMPONENT\tID\tADDRESS\tLEASE\tDATA")
			for _, in := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%x\t%s\n", in.Component, in.ID, in.Address, in.Lease, string(in.Data))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

// eventJSON is one line of registry watch --json.
type eventJSON struct {
	Type      string            `json:"type"`
	Component string            `json:"component"`
	ID        string            `json:"id"`
	Value     registry.Endpoint `json:"value"`
	Revision  int64             `json:"revision"`
}

func (a *app) registryWatchCommand() *cobra.Command {
	var asJSON, snapshot bool
	cmd := &cobra.Command{
		Use:   "watch [COMPONENT] [--json]",
		Short: "Print the registered endpoints, then every change, until interrupted",
		Long: `Print the current endpoints (as put events; --snapshot=false skips them), then
every put and delete in revision order, with no gap and no duplicate, until
SIGINT or SIGTERM. An etcd restart is resumed where it stopped; a watch that
fell behind a compaction re-reads the endpoints and prints the differences. With --json each event is
one line: {"type":"put"|"delete","component":...,"id":...,"value":...,"revision":N}.`,
		Example: `  drover registry watch VllmWorker --json`,
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			component, err := optionalComponent(args)
			if err != nil {
				return err
			}
			if err := a.checkGlobal(); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			cli, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer cli.Close()
			w, err := registry.Watch(ctx, cli, a.namespace, component, registry.WithWatchLogger(a.logger))
			if err != nil {
				return err
			}
			defer w.Close(context.Background())
			enc := json.NewEncoder(a.stdout)
			print := func(ev registry.Event) error {
				if asJSON {
					return enc.Encode(eventJSON{Type: ev.Type.String(), Component: ev.Instance.Component, ID: ev.Instance.ID, Value: ev.Instance.Endpoint, Revision: ev.Revision})
				}
				_, err := fmt.Fprintf(a.stdout, "%-6s %s/%s rev %d address %s data %s\n", ev.Type, ev.Instance.Component, ev.Instance.ID, ev.Revision, ev.Instance.Address, string(ev.Instance.Data))
				return err
			}
			if snapshot {
				list, _ := w.Snapshot()
				for _, in := range list {
					if err := print(registry.Event{Type: registry.Put, Instance: in, Revision: in.ModRevision}); err != nil {
						return err
					}
				}
			}
			for {
				select {
				case <-ctx.Done():
					return nil
				case ev, ok := <-w.Events():
					if !ok {
						return nil
					}
					if err := print(ev); err != nil {
						return err
					}
				}
			}
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per event")
	cmd.Flags().BoolVar(&snapshot, "snapshot", true, "print the current endpoints first")
	return cmd
}

func (a *app) workersCommand() *cobra.Command {
	var (
		asJSON bool
		q      string
	)
	cmd := &cobra.Command{
		Use:   "workers [--queue Q] [--json]",
		Short: "List live workers and their load",
		Long: `List the drover worker processes that are alive now: every worker registers
itself (component "worker") under its lease and refreshes its in-flight count
every few seconds; a dead worker drops out within its TTL.`,
		Example: `  drover workers
  drover workers --queue emails --json | jq 'map(.in_flight) | add'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if q != "" {
				if err := drover.Rename(queue.CheckQueue(q), "--queue"); err != nil {
					return err
				}
			}
			list, err := a.listEndpoints(cmd.Context(), registry.WorkerComponent)
			if err != nil {
				return err
			}
			type row struct {
				ID      string `json:"id"`
				Address string `json:"address"`
				registry.WorkerInfo
			}
			rows := []row{}
			for _, in := range list {
				var d registry.WorkerInfo
				_ = json.Unmarshal(in.Data, &d)
				if q != "" && d.Queue != q {
					continue
				}
				rows = append(rows, row{ID: in.ID, Address: in.Address, WorkerInfo: d})
			}
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(rows)
			}
			if len(rows) == 0 {
				fmt.Fprintln(a.stdout, "no live workers")
				return nil
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "WORKER\tQUEUE\tIN FLIGHT\tCONCURRENCY\tCLAIMED\tSUCCEEDED\tFAILED\tUP")
			for _, r := range rows {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", r.ID, r.Queue, r.InFlight, r.Concurrency, r.Claimed, r.Succeeded, r.Failed,
					time.Since(r.StartedAt).Round(time.Second))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	cmd.Flags().StringVar(&q, "queue", "", "only workers of this queue")
	return cmd
}
