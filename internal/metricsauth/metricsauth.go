// Package metricsauth is how qvirt-controller and qvirt-handler serve /metrics: over HTTPS, each
// request's bearer token checked with a TokenReview and its right to GET the non-resource URL
// /metrics with a SubjectAccessReview. A scraper's ServiceAccount needs a binding to ClusterRole
// qvirt-metrics-reader (config/rbac/metrics_reader_role.yaml); anyone else gets 401 or 403. The
// handler's metrics name every VMI of its node and ask its launchers for their figures, so they
// are not for whoever can reach the node's port.
package metricsauth

import (
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	"sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// ServerOptions are the manager's metrics options for bindAddress ("0" disables the server).
// certDir holds tls.crt and tls.key; when "", controller-runtime makes a self-signed certificate
// at start (scrapers then skip verification, as they do for kubelets' self-signed ones).
func ServerOptions(bindAddress, certDir string) server.Options {
	return server.Options{
		BindAddress:    bindAddress,
		SecureServing:  true,
		FilterProvider: filters.WithAuthenticationAndAuthorization,
		CertDir:        certDir,
	}
}

// The filter's reviews, for both managers' roles (the Makefile's manifests target reads this
// package for each).
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
