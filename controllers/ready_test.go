package controllers_test

import (
	"errors"
	"net/http"
	"testing"

	"github.com/qvirt/qvirt/controllers"
)

func TestWebhookReadyDialsUntilStartedOnly(t *testing.T) {
	calls := 0
	started := func(*http.Request) error {
		calls++
		if calls < 3 {
			return errors.New("tls: no serving certificate yet")
		}
		return nil
	}
	ready := controllers.WebhookReady(started)
	for i := 1; i <= 2; i++ {
		if err := ready(nil); err == nil {
			t.Fatalf("check %d: ready before the webhook server serves", i)
		}
	}
	for i := 3; i <= 10; i++ {
		if err := ready(nil); err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
	}
	if calls != 3 {
		t.Errorf("the started check ran %d times, want 3 (until it passed)", calls)
	}
}
