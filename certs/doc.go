// Package certs makes and serves the certificates of the mutual TLS link between qvirt-api and
// qvirt-handler (full documentation follows).
package certs
