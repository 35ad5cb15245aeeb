// Package drain ends a server the way a deleted pod should end: on SIGTERM it first turns not
// ready (so its Service's endpoints drop it), keeps serving for a delay while that reaches the
// callers, and only then stops.
package drain

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
)

// Drain is the state of one process's shutdown.
type Drain struct {
	draining atomic.Bool
}

// OnSignal returns a context that ends delay after the first SIGTERM or SIGINT, or at once on a
// second; from the first, Ready fails.
func OnSignal(log logr.Logger, delay time.Duration) (context.Context, *Drain) {
	ctx, cancel := context.WithCancel(context.Background())
	d := &Drain{}
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		d.draining.Store(true)
		log.Info("stopping: not ready, still serving", "for", delay)
		select {
		case <-time.After(delay):
		case <-sig:
		}
		cancel()
	}()
	return ctx, d
}

// ErrDraining is what Ready returns once a signal came.
var ErrDraining = errors.New("shutting down")

// Ready wraps a readiness check (a controller-runtime healthz.Checker): it fails once draining.
func (d *Drain) Ready(check func(*http.Request) error) func(*http.Request) error {
	return func(req *http.Request) error {
		if d.draining.Load() {
			return ErrDraining
		}
		return check(req)
	}
}
