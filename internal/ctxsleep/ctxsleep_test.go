package ctxsleep

import (
	"context"
	"testing"
	"time"
)

func TestSleep(t *testing.T) {
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("a live context: Sleep reported it ended")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, 0) {
		t.Fatal("an ended context with no wait: Sleep reported it live")
	}
	start := time.Now()
	if Sleep(ctx, time.Hour) {
		t.Fatal("an ended context: Sleep reported it live")
	}
	if waited := time.Since(start); waited > time.Second {
		t.Fatalf("an ended context still slept %s", waited)
	}
}
