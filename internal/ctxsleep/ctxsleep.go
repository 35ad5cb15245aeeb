// Package ctxsleep waits for a duration that a context can cut short, so that loops which pause
// between attempts stop as soon as their caller is done.
package ctxsleep

import (
	"context"
	"time"
)

// Sleep waits d, or less when ctx ends first; it reports false when ctx ended (before or during
// the wait), so callers can write `if !ctxsleep.Sleep(ctx, d) { return }`.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
