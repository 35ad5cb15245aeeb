package v1alpha1

import "time"

// CompletionTimeout is how long a migration of the instance may run in pre-copy: perGiB seconds
// for every started GiB of guest memory (at least one); 0 (no limit) when perGiB is 0. A migration
// that may switch to post-copy (MigrationConfiguration.PostCopy) switches then rather than being
// aborted.
func CompletionTimeout(spec *VirtualMachineInstanceSpec, perGiB int64) time.Duration {
	if perGiB <= 0 {
		return 0
	}
	const gib = 1 << 30
	gibs := int64(1)
	if q := GuestMemory(&spec.Domain); q != nil {
		if n := (q.Value() + gib - 1) / gib; n > 1 {
			gibs = n
		}
	}
	return time.Duration(perGiB*gibs) * time.Second
}

// PostCopy reports whether the settings let the migration switch to post-copy: allowPostCopy,
// and not over parallel streams (QEMU 7.2 sends post-copy pages over the main stream only).
func (c *MigrationConfiguration) PostCopy() bool {
	return c != nil && c.AllowPostCopy != nil && *c.AllowPostCopy &&
		(c.ParallelMigrationThreads == nil || *c.ParallelMigrationThreads == 0)
}
