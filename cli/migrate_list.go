package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"

	qv1 "github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/cli/kube"
)

func newMigrateList(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "migrate-list [VM]",
		Short: "List live migrations, saying which a node drain started",
		Long: "Lists the namespace's VirtualMachineInstanceMigrations (of one VM when named), oldest first:\n" +
			"name, VMI, phase, why it was started (\"user\", or \"evacuation of NODE\" for one qvirt\n" +
			"started because NODE is being drained), source and target node, the reason of a failure,\n" +
			"and age.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			vm := ""
			if len(args) == 1 {
				vm = args[0]
			}
			return e.migrateList(cmd.Context(), cmd.OutOrStdout(), vm)
		},
	}
}

func newMigrateCancel(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "migrate-cancel VM",
		Short: "Cancel the live migration of a virtual machine that is under way",
		Long: "Deletes the VM's migration that has not ended, as virtctl migrate-cancel does: qvirt aborts it\n" +
			"and the guest runs on at the source. A migration a node drain started (an evacuation) is\n" +
			"started again while the VMI stays marked for evacuation (status.evacuationNodeName), as\n" +
			"KubeVirt's evacuation controller does.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return e.migrateCancel(cmd.Context(), cmd.OutOrStdout(), args[0])
		},
	}
}

func (e *env) migrateList(ctx context.Context, w io.Writer, vm string) error {
	c, list, err := e.migrations(ctx)
	if err != nil {
		return err
	}
	items := list.Items
	if vm != "" {
		items = slices.DeleteFunc(items, func(m qv1.VirtualMachineInstanceMigration) bool { return m.Spec.VMIName != vm })
	}
	if len(items) == 0 {
		fmt.Fprintf(w, "No migrations found in namespace %s.\n", c.Namespace)
		return nil
	}
	slices.SortStableFunc(items, func(a, b qv1.VirtualMachineInstanceMigration) int {
		return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
	})
	writeMigrations(w, items, time.Now())
	return nil
}

// writeMigrations prints migrations as a table.
func writeMigrations(w io.Writer, items []qv1.VirtualMachineInstanceMigration, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tVMI\tPHASE\tTRIGGER\tSOURCE\tTARGET\tREASON\tAGE")
	for i := range items {
		m := &items[i]
		phase := string(m.Status.Phase)
		if phase == "" {
			phase = string(qv1.MigrationPending)
		}
		if !m.DeletionTimestamp.IsZero() && m.Status.Phase != qv1.MigrationSucceeded && m.Status.Phase != qv1.MigrationFailed {
			phase += " (cancelling)"
		}
		src, dst := "-", "-"
		if ms := m.Status.MigrationState; ms != nil {
			src, dst = orDash(ms.SourceNode), orDash(ms.TargetNode)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.Name, m.Spec.VMIName, phase, migrationTrigger(m), src, dst,
			orDash(migrationFailure(m)), duration.HumanDuration(now.Sub(m.CreationTimestamp.Time)))
	}
	tw.Flush()
}

// migrationTrigger says who asked for a migration: a node drain (the evacuation annotation), or a
// user.
func migrationTrigger(m *qv1.VirtualMachineInstanceMigration) string {
	if node, ok := m.Annotations[qv1.EvacuationMigrationAnnotation]; ok {
		return "evacuation of " + node
	}
	return "user"
}

// migrationFailure is the reason a failed migration gives, on one line.
func migrationFailure(m *qv1.VirtualMachineInstanceMigration) string {
	if m.Status.Phase != qv1.MigrationFailed {
		return ""
	}
	if c := meta.FindStatusCondition(m.Status.Conditions, "Failed"); c != nil && c.Message != "" {
		return strings.ReplaceAll(c.Message, "\n", " ")
	}
	if ms := m.Status.MigrationState; ms != nil {
		return ms.FailureReason
	}
	return ""
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (e *env) migrateCancel(ctx context.Context, w io.Writer, vm string) error {
	c, list, err := e.migrations(ctx)
	if err != nil {
		return err
	}
	var active []qv1.VirtualMachineInstanceMigration
	for _, m := range list.Items {
		if m.Spec.VMIName == vm && m.DeletionTimestamp.IsZero() && m.Status.Phase != qv1.MigrationSucceeded && m.Status.Phase != qv1.MigrationFailed {
			active = append(active, m)
		}
	}
	if len(active) == 0 {
		return fmt.Errorf("VM %s in namespace %s has no migration under way to cancel (see: %s migrate-list %s)", vm, c.Namespace, e.self, vm)
	}
	for i := range active {
		m := &active[i]
		if err := c.Objects.Delete(ctx, m, client.Preconditions{UID: &m.UID}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("cancel migration %s: %w", m.Name, err)
		}
		fmt.Fprintf(w, "VM %s: migration %s (%s) cancelled\n", vm, m.Name, migrationTrigger(m))
	}
	return nil
}

// migrations connects and lists the migrations of the namespace.
func (e *env) migrations(ctx context.Context) (*kube.Client, *qv1.VirtualMachineInstanceMigrationList, error) {
	c, err := e.connect()
	if err != nil {
		return nil, nil, err
	}
	var list qv1.VirtualMachineInstanceMigrationList
	if err := c.Objects.List(ctx, &list, client.InNamespace(c.Namespace)); err != nil {
		return nil, nil, fmt.Errorf("list migrations in namespace %s: %w", c.Namespace, err)
	}
	return c, &list, nil
}
