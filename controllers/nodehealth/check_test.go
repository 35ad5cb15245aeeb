package nodehealth

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

func TestCheck(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	const timeout = 5 * time.Minute
	at := func(d time.Duration) string { return now.Add(d).Format(time.RFC3339) }
	tests := []struct {
		name        string
		labels      map[string]string
		annotations map[string]string
		want        Health
		whyHas      string
	}{
		{name: "no agent ever", want: Health{}},
		{name: "other labels only", labels: map[string]string{"kubernetes.io/os": "linux"}, want: Health{}},
		{name: "fresh", annotations: map[string]string{v1alpha1.NodeHeartbeatAnnotation: at(-time.Minute)},
			want: Health{Managed: true, Deadline: now.Add(4 * time.Minute)}},
		{name: "just before the deadline", annotations: map[string]string{v1alpha1.NodeHeartbeatAnnotation: at(-timeout + time.Second)},
			want: Health{Managed: true, Deadline: now.Add(time.Second)}},
		{name: "at the deadline", annotations: map[string]string{v1alpha1.NodeHeartbeatAnnotation: at(-timeout)},
			want: Health{Managed: true, Dead: true, Deadline: now}, whyHas: "more than 5m0s ago"},
		{name: "stale", labels: map[string]string{v1alpha1.NodeSchedulableLabel: "true"}, annotations: map[string]string{v1alpha1.NodeHeartbeatAnnotation: at(-time.Hour)},
			want: Health{Managed: true, Dead: true, Deadline: now.Add(-55 * time.Minute)}, whyHas: "last heartbeat at 2026-11-30T11:00:00Z"},
		{name: "heartbeat lost", labels: map[string]string{v1alpha1.NodeSchedulableLabel: "false"},
			want: Health{Managed: true, Dead: true}, whyHas: "is gone"},
		{name: "heartbeat garbled", annotations: map[string]string{v1alpha1.NodeHeartbeatAnnotation: "yesterday"},
			want: Health{Managed: true, Dead: true}, whyHas: `"yesterday" is not an RFC 3339 time`},
		{name: "beat in the future (clock skew)", annotations: map[string]string{v1alpha1.NodeHeartbeatAnnotation: at(time.Minute)},
			want: Health{Managed: true, Deadline: now.Add(6 * time.Minute)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Check(&metav1.ObjectMeta{Labels: tt.labels, Annotations: tt.annotations}, timeout, now)
			if !strings.Contains(got.Why, tt.whyHas) || (tt.whyHas == "") != (got.Why == "") {
				t.Errorf("why %q, want it to contain %q", got.Why, tt.whyHas)
			}
			got.Why = ""
			if !got.Deadline.Equal(tt.want.Deadline) || got.Managed != tt.want.Managed || got.Dead != tt.want.Dead {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// FuzzCheck feeds arbitrary heartbeat annotations: Check must never panic, a managed node is either
// dead with a reason or alive with a deadline in the future.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{"2026-11-30T12:00:00Z", "2026-11-30T12:00:00+02:00", "", "garbage", "9999-12-31T23:59:59Z", "0000-01-01T00:00:00Z"} {
		f.Add(s)
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, beat string) {
		h := Check(&metav1.ObjectMeta{Annotations: map[string]string{v1alpha1.NodeHeartbeatAnnotation: beat}}, DefaultTimeout, now)
		if !h.Managed {
			t.Fatal("a node with a heartbeat annotation is not managed")
		}
		if h.Dead && h.Why == "" {
			t.Fatal("dead without a reason")
		}
		if !h.Dead && !h.Deadline.After(now) {
			t.Fatalf("alive with deadline %s not after now", h.Deadline)
		}
	})
}
