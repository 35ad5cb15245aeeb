// Package containerd pins the container runtime that real kubelet nodes use (containerd and its
// runc shim). It is its own module because containerd's dependency graph and k8s.io/kubernetes'
// need not agree; go.mod's tool directive declares the commands, this file only gives the module a package.
package containerd
