// Package apiserver is qvirt-api: the aggregated API server of the group subresources.qvirt.io
// (contract in api/subresources/v1alpha1). kube-apiserver authenticates the user and proxies to it
// through the APIService v1alpha1.subresources.qvirt.io; this server authenticates kube-apiserver's
// front proxy (request-header CA from the extension-apiserver-authentication ConfigMap) and
// authorises every request with a SubjectAccessReview, both delegated through k8s.io/apiserver.
// Every subresource is a rest.Connecter storage, so the request attributes are group
// subresources.qvirt.io, resource virtualmachineinstances or virtualmachines, subresource console,
// vnc, qmp, ... and RBAC rules on those apply: streams and screenshot are verb get (a websocket
// upgrade is a GET), actions are verb update (PUT).
//
// Streams (console, VNC, QMP) and the VMI actions are relayed to the qvirt-handler of the VMI's node
// (its address in the node annotation qvirt.io/streams-address) over mutual TLS; the end user is
// passed in X-Qvirt-User and X-Qvirt-Groups. The QMP shell's write permission
// (virtualmachineinstances/qmp-write, verb update) is checked with this server's authorizer when
// the stream opens and passed as X-Qvirt-QMP-Write; the handler filters commands accordingly.
//
// VM actions are carried out here, with qvirt-api's own credentials once the user's request is
// authorised: start, stop and restart append to the VM's status.stateChangeRequests (the VM
// controller acts on them), migrate creates a VirtualMachineInstanceMigration, addvolume and
// removevolume edit the VM's template and the running VMI's spec (the node agent hot-plugs the
// difference).
//
// # Start, stop and restart versus the run strategy
//
// KubeVirt's virtctl rewrites spec.runStrategy (stop turns Always into Halted, start turns it back
// into Always). qvirt does not: its VM controller (controllers/vm) holds a runStrategy Always VM
// down after a Stop request until a Start request (condition StoppedByRequest), and a
// RerunOnFailure, Once or Manual VM whose instance a Stop deleted stays down until a Start. So
// every action is only a status.stateChangeRequests entry and the spec stays the user's (GitOps
// tools see no drift). What qvirt-api refuses with 409:
//
//	start    runStrategy Halted (the controller refuses starts; change the run strategy), or an
//	         active instance and no pending Stop (already running)
//	stop     no active instance; an instance not Running yet unless force
//	restart  runStrategy Halted; no active instance
//	migrate  no instance, or one that is not Running
//
// Stop's grace period goes into the Stop request's data as gracePeriodSeconds (force is "0");
// a Stop names the UID of the instance it is for, so a stale one cannot stop its successor.
package apiserver
