package nodehealth

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
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

func TestLost(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	const timeout = 5 * time.Minute
	node := func(status corev1.ConditionStatus, since time.Duration) *corev1.Node {
		return &corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionTrue},
			{Type: corev1.NodeReady, Status: status, Reason: "NodeStatusUnknown", LastTransitionTime: metav1.NewTime(now.Add(since))}}}}
	}
	tests := []struct {
		name string
		node *corev1.Node
		want Loss
	}{
		{"no Ready condition (no kubelet ever)", &corev1.Node{}, Loss{}},
		{"Ready", node(corev1.ConditionTrue, -time.Hour), Loss{}},
		{"not Ready for a minute", node(corev1.ConditionUnknown, -time.Minute), Loss{Deadline: now.Add(4 * time.Minute)}},
		{"not Ready for the timeout", node(corev1.ConditionFalse, -timeout), Loss{Lost: true, Deadline: now}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Lost(tt.node, timeout, now)
			if got.Lost != tt.want.Lost || !got.Deadline.Equal(tt.want.Deadline) {
				t.Fatalf("Lost = %+v, want %+v", got, tt.want)
			}
			if got.Lost && !strings.Contains(got.Why, "Ready condition is False") {
				t.Errorf("why %q does not say the Ready condition", got.Why)
			}
		})
	}
}
