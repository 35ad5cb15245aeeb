package v1alpha1

import corev1 "k8s.io/api/core/v1"

// Probe is a health check of the guest, KubeVirt's kubevirt.io/v1 Probe: the handler (exactly one
// of tcpSocket, httpGet, exec or guestAgentPing) and the kubelet's timing fields. qvirt-controller
// puts a tcpSocket or httpGet probe on the launcher pod's compute container, as KubeVirt's
// virt-controller does (pkg/virt-controller/services/template.go): the kubelet then runs it
// against the pod IP, which the guest's interface answers (masquerade forwards the pod IP's ports
// to the guest, bridge gives the guest the pod IP). A readiness probe gates the pod's Ready
// condition and so the Service endpoints that select the VM and the instance's Ready condition; a
// liveness probe that fails makes the kubelet stop the compute container, which ends the instance,
// and the VirtualMachine's runStrategy decides whether it starts again.
//
// +kubebuilder:validation:XValidation:rule="[has(self.tcpSocket), has(self.httpGet), has(self.exec), has(self.guestAgentPing)].filter(x, x).size() == 1",message="set exactly one of tcpSocket, httpGet, exec or guestAgentPing"
type Probe struct {
	// The action the probe takes.
	Handler `json:",inline"`

	// InitialDelaySeconds is how long after the compute container starts the first probe runs.
	// +optional
	// +kubebuilder:validation:Minimum=0
	InitialDelaySeconds int32 `json:"initialDelaySeconds,omitempty"`

	// TimeoutSeconds is how long one probe may take. Defaults to 1.
	// +optional
	// +kubebuilder:validation:Minimum=0
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`

	// PeriodSeconds is how often the probe runs. Defaults to 10.
	// +optional
	// +kubebuilder:validation:Minimum=0
	PeriodSeconds int32 `json:"periodSeconds,omitempty"`

	// SuccessThreshold is how many successes in a row count as passing after a failure. Defaults
	// to 1; must be 1 for a liveness probe.
	// +optional
	// +kubebuilder:validation:Minimum=0
	SuccessThreshold int32 `json:"successThreshold,omitempty"`

	// FailureThreshold is how many failures in a row count as failing. Defaults to 3.
	// +optional
	// +kubebuilder:validation:Minimum=0
	FailureThreshold int32 `json:"failureThreshold,omitempty"`
}

// Handler is the action of a Probe, KubeVirt's kubevirt.io/v1 Handler. Set exactly one.
type Handler struct {
	// Exec runs a command in the guest through its guest agent.
	// +optional
	Exec *corev1.ExecAction `json:"exec,omitempty"`

	// HTTPGet sends an HTTP GET to the guest; a status from 200 to 399 passes.
	// +optional
	HTTPGet *corev1.HTTPGetAction `json:"httpGet,omitempty"`

	// TCPSocket opens a TCP connection to a port of the guest; connecting passes.
	// +optional
	TCPSocket *corev1.TCPSocketAction `json:"tcpSocket,omitempty"`

	// GuestAgentPing sends guest-ping to the guest agent; an answer passes.
	// +optional
	GuestAgentPing *GuestAgentPing `json:"guestAgentPing,omitempty"`
}

// GuestAgentPing selects the guest agent ping probe.
type GuestAgentPing struct{}
