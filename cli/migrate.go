package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subv1 "github.com/qvirt/qvirt/api/subresources/v1alpha1"
	qv1 "github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/cli/kube"
)

func newMigrate(e *env) *cobra.Command {
	var wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "migrate VM",
		Short: "Live-migrate a virtual machine to another node",
		Long: "PUT .../virtualmachines/VM/migrate creates a VirtualMachineInstanceMigration and prints\n" +
			"\"virtualmachineinstancemigration.qvirt.io/NAME created\" on stdout.\n\n" +
			"With --wait it follows the migration (watching the VMI's status.migrationState and the\n" +
			"migration's phase) and draws a progress bar on stderr: data processed of total, data\n" +
			"remaining, throughput. At the end it prints the guest's downtime and the total time and\n" +
			"exits 0 when the migration succeeded, 1 when it failed (with the reason) or when --timeout\n" +
			"passed first.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return e.migrate(cmd.Context(), cmd, args[0], wait, timeout)
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "follow the migration until it ends, with a progress bar")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Minute, "with --wait, how long to wait for the end")
	return cmd
}

func (e *env) migrate(ctx context.Context, cmd *cobra.Command, name string, wait bool, timeout time.Duration) error {
	c, err := e.connect()
	if err != nil {
		return err
	}
	b, err := c.Do(ctx, "PUT", subv1.Path(c.Namespace, subv1.VirtualMachines, name, subv1.Migrate), &subv1.MigrateOptions{})
	if err != nil {
		return err
	}
	var vmim qv1.VirtualMachineInstanceMigration
	if err := json.Unmarshal(b, &vmim); err != nil || vmim.Name == "" {
		return fmt.Errorf("migrate answered %q, not a VirtualMachineInstanceMigration", truncate(b, 200))
	}
	fmt.Fprintf(cmd.OutOrStdout(), "virtualmachineinstancemigration.qvirt.io/%s created\n", vmim.Name)
	if !wait {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	bar := newProgressBar(cmd.ErrOrStderr())
	err = followMigration(ctx, c, name, vmim.Name, bar)
	if ctx.Err() == context.DeadlineExceeded {
		bar.finish()
		return fmt.Errorf("migration %s still running after --timeout %s; follow it with: kubectl get vmim %s -n %s -w",
			vmim.Name, timeout, vmim.Name, c.Namespace)
	}
	return err
}

// migrationView is what the progress bar shows: the migration's phase and the freshest state.
type migrationView struct {
	vmim  *qv1.VirtualMachineInstanceMigration
	state *qv1.VirtualMachineInstanceMigrationState
}

// followMigration watches the VMI and the migration until the migration ends.
func followMigration(ctx context.Context, c *kube.Client, vmiName, vmimName string, bar *progressBar) error {
	events := make(chan client.Object, 16)
	go watchNamed(ctx, c, &qv1.VirtualMachineInstanceList{}, vmiName, events)
	go watchNamed(ctx, c, &qv1.VirtualMachineInstanceMigrationList{}, vmimName, events)
	var view migrationView
	var vmi *qv1.VirtualMachineInstance
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case obj := <-events:
			switch o := obj.(type) {
			case *qv1.VirtualMachineInstance:
				vmi = o
			case *qv1.VirtualMachineInstanceMigration:
				view.vmim = o
			}
		}
		view.state = currentState(view.vmim, vmi)
		bar.draw(view)
		if done, err := migrationEnded(view); done {
			if err == nil {
				bar.summary(view)
			}
			bar.finish()
			return err
		}
	}
}

// currentState prefers the VMI's migrationState when it is this migration's; the migration's own
// copy otherwise.
func currentState(vmim *qv1.VirtualMachineInstanceMigration, vmi *qv1.VirtualMachineInstance) *qv1.VirtualMachineInstanceMigrationState {
	if vmim == nil {
		return nil
	}
	if vmi != nil && vmi.Status.MigrationState != nil && vmi.Status.MigrationState.MigrationUID == vmim.UID {
		return vmi.Status.MigrationState
	}
	return vmim.Status.MigrationState
}

// migrationEnded reports whether the migration is over and, when it failed, why.
func migrationEnded(v migrationView) (bool, error) {
	if v.vmim == nil {
		return false, nil
	}
	st := v.state
	failed := v.vmim.Status.Phase == qv1.MigrationFailed || (st != nil && st.Failed)
	if failed {
		return true, &exitError{code: 1, err: fmt.Errorf("migration %s failed: %s", v.vmim.Name, failureReason(v))}
	}
	return v.vmim.Status.Phase == qv1.MigrationSucceeded, nil
}

func failureReason(v migrationView) string {
	if v.state != nil && v.state.FailureReason != "" {
		return v.state.FailureReason
	}
	// The controller's own refusals and failures (the target's images, a timeout) are in the
	// Failed condition; the others say how far the migration got.
	if c := meta.FindStatusCondition(v.vmim.Status.Conditions, qv1.MigrationConditionFailed); c != nil && c.Message != "" {
		return fmt.Sprintf("%s (%s)", c.Message, c.Reason)
	}
	return "no reason given; see: kubectl describe vmim " + v.vmim.Name
}

// watchNamed sends every version of the named object of list's kind, re-watching when the server
// ends a watch, until ctx ends.
func watchNamed(ctx context.Context, c *kube.Client, list client.ObjectList, name string, out chan<- client.Object) {
	for ctx.Err() == nil {
		w, err := c.Objects.Watch(ctx, list, client.InNamespace(c.Namespace), client.MatchingFields{"metadata.name": name})
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(pollInterval):
			}
			continue
		}
		for ev := range w.ResultChan() {
			obj, ok := ev.Object.(client.Object)
			if !ok || ev.Type == watch.Error || ev.Type == watch.Deleted {
				continue
			}
			select {
			case out <- obj:
			case <-ctx.Done():
				w.Stop()
				return
			}
		}
		w.Stop()
	}
}

// progressBar draws a migration's progress on one terminal line (redrawn in place), or as
// separate lines when the output is not a terminal.
type progressBar struct {
	w        io.Writer
	tty      bool
	last     string
	started  time.Time
	lastTime time.Time
	lastData int64
	rate     float64 // bytes per second, smoothed
	drawn    bool
}

func newProgressBar(w io.Writer) *progressBar {
	tty := false
	if f, ok := w.(*os.File); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	return &progressBar{w: w, tty: tty, started: time.Now()}
}

func (b *progressBar) draw(v migrationView) {
	line := b.render(v, time.Now())
	if line == b.last {
		return
	}
	b.last = line
	if b.tty {
		fmt.Fprintf(b.w, "\r%s\033[K", line)
	} else {
		fmt.Fprintln(b.w, line)
	}
	b.drawn = true
}

// render is the bar's text at now; it also updates the throughput estimate.
func (b *progressBar) render(v migrationView, now time.Time) string {
	phase := "Pending"
	if v.vmim != nil && v.vmim.Status.Phase != "" {
		phase = string(v.vmim.Status.Phase)
	}
	st := v.state
	if st == nil || st.DataTotalBytes == nil || *st.DataTotalBytes <= 0 {
		return fmt.Sprintf("%-15s [%s]", phase, strings.Repeat(" ", barWidth))
	}
	total := *st.DataTotalBytes
	processed := deref(st.DataProcessedBytes)
	remaining := deref(st.DataRemainingBytes)
	b.sample(processed, now)
	pct := migrationPercent(total, remaining, processed, st.Completed)
	filled := int(pct * barWidth / 100)
	return fmt.Sprintf("%-15s [%s%s] %3d%% %s processed of %s, %s remaining, %s/s", phase,
		strings.Repeat("#", filled), strings.Repeat(".", barWidth-filled), pct,
		humanBytes(processed), humanBytes(total), humanBytes(remaining), humanBytes(int64(b.rate)))
}

const barWidth = 30

// migrationPercent is progress from what remains (processed can exceed total when pages are
// re-sent), 100 once completed.
func migrationPercent(total, remaining, processed int64, completed bool) int {
	if completed {
		return 100
	}
	pct := int64(0)
	if remaining > 0 || processed > 0 {
		pct = (total - min(remaining, total)) * 100 / total
	}
	return int(min(max(pct, 0), 99))
}

// sample updates the throughput from a new processed count; updates of other fields (the same
// count again) leave it as it was.
func (b *progressBar) sample(processed int64, now time.Time) {
	if !b.lastTime.IsZero() && processed == b.lastData {
		return
	}
	if !b.lastTime.IsZero() && now.After(b.lastTime) && processed > b.lastData {
		r := float64(processed-b.lastData) / now.Sub(b.lastTime).Seconds()
		if b.rate == 0 {
			b.rate = r
		} else {
			b.rate = 0.5*b.rate + 0.5*r
		}
	}
	b.lastTime, b.lastData = now, processed
}

// summary prints the downtime and total time of a finished migration.
func (b *progressBar) summary(v migrationView) {
	b.finish()
	total := time.Since(b.started)
	switch st := v.state; {
	case st != nil && st.TotalTimeMilliseconds != nil:
		total = time.Duration(*st.TotalTimeMilliseconds) * time.Millisecond
	case st != nil && st.StartTimestamp != nil && st.EndTimestamp != nil && st.EndTimestamp.Sub(st.StartTimestamp.Time) >= time.Second:
		// Whole seconds only: below one, the time this command watched is closer.
		total = st.EndTimestamp.Sub(st.StartTimestamp.Time)
	}
	downtime := "unknown"
	if v.state != nil && v.state.DowntimeMilliseconds != nil {
		downtime = fmt.Sprintf("%d ms", *v.state.DowntimeMilliseconds)
	}
	fmt.Fprintf(b.w, "migration %s succeeded: downtime %s, total time %s\n", v.vmim.Name, downtime, total.Round(time.Millisecond))
}

// finish ends the in-place line.
func (b *progressBar) finish() {
	if b.tty && b.drawn {
		fmt.Fprintln(b.w)
	}
	b.drawn = false
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// humanBytes renders n in binary units, as kubectl renders quantities.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
