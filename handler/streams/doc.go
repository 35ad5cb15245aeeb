// Package streams is qvirt-handler's stream server: HTTPS with mutual TLS, serving the serial
// console, the VNC display and the operator QMP shell of every VMI on the handler's node, plus the
// imperative pause, unpause and soft reboot actions and screenshots. qvirt-api is its only client: it authenticates and
// authorises the end user (kube-apiserver plus SubjectAccessReview) and proxies to the handler of
// the VMI's node.
//
// # Transport and identity
//
// Only clients presenting a certificate signed by the configured client CA complete the TLS
// handshake (tls.RequireAndVerifyClientCert); Options.AllowedClientNames can further restrict the
// certificate's subject CN or DNS SANs. The certificate authenticates qvirt-api, not the end user:
// qvirt-api passes the user in headers, which the handler trusts because of the certificate:
//
//	X-Qvirt-User: alice              required; the end user's name, logged with every QMP command
//	X-Qvirt-Groups: devs             the user's groups, one header per group (like X-Remote-Group)
//	X-Qvirt-QMP-Write: true          the user holds virtualmachineinstances/qmp-write
//
// Certificate, key and client CA are read from files and re-read when one of them changes, so a
// rotated Secret takes effect on the next handshake without a restart.
//
// # Endpoints (version v1)
//
// Paths are relative to https://<node-address>:<port>; {ns} and {name} name the VMI.
//
//	GET /v1/namespaces/{ns}/virtualmachineinstances/{name}/console   websocket, subprotocol plain.qvirt.io
//	GET /v1/namespaces/{ns}/virtualmachineinstances/{name}/vnc       websocket, subprotocol plain.qvirt.io (or binary)
//	GET /v1/namespaces/{ns}/virtualmachineinstances/{name}/qmp       websocket, subprotocol qmp.qvirt.io
//	PUT /v1/namespaces/{ns}/virtualmachineinstances/{name}/pause     stop the guest's vCPUs
//	PUT /v1/namespaces/{ns}/virtualmachineinstances/{name}/unpause   restart them
//	PUT /v1/namespaces/{ns}/virtualmachineinstances/{name}/softreboot  Ctrl+Alt+Del on the guest's keyboard
//	GET /v1/namespaces/{ns}/virtualmachineinstances/{name}/screenshot  image/png of the display
//
// A websocket client must offer the endpoint's subprotocol or none; offering only others is
// refused with 400. Failures before the upgrade are HTTP errors whose JSON body is a
// Kubernetes metav1.Status (kind Status, code, reason, message), so qvirt-api can relay them as is:
//
//	400 BadRequest          missing X-Qvirt-User, wrong subprotocol, a VMI without a serial console
//	                        or graphics device (spec.domain.devices.autoattach*)
//	404 NotFound            no such VMI on this node (the handler's cache holds only its node's VMIs)
//	409 Conflict            the VMI runs on another node or is not Running (the message says which
//	                        node or phase); the QMP shell is already in use (see below); the launcher
//	                        refuses the action in the current state (a soft reboot while paused:
//	                        "VMI is paused; unpause it first")
//	503 ServiceUnavailable  the VMI's socket is missing or refuses connections (QEMU not started
//	                        yet or gone); the launcher does not answer
//
// Actions answer 200 with a metav1.Status of status Success; screenshot answers 200 with the PNG
// (Content-Type image/png), or a metav1.Status when it fails before the first byte.
//
// # Soft reboot and screenshot
//
// There is no guest agent: softreboot presses Ctrl+Alt+Del (QMP send-key), which Linux hands to
// init (busybox's ctrlaltdel action, systemd's ctrl-alt-del.target) for a clean reboot. It answers
// once the keys are sent; the guest reboots in the same QEMU (started without -no-reboot), so the
// VMI stays Running. A guest that ignores the keys does not reboot. A paused VMI is refused (409)
// rather than rebooting at some later unpause. screenshot is QMP screendump in PNG, written by QEMU
// to a temporary file in the VMI's socket directory and streamed by the launcher; a paused guest
// gives its last picture, a VMI without a graphics device is refused with 400.
//
// # Console and VNC
//
// Bytes both ways, in binary frames from the handler (a client may send text or binary frames; their
// payload is written as is). The console is the guest's ttyS0; VNC is QEMU's RFB server, starting
// with its "RFB 003.008" greeting. QEMU's serial chardev serves one client at a time, so a VMI has one
// console session: a new one takes over and the old one is closed with status 4001
// (StatusTakenOver) and a reason naming the new session's user.
//
// A client message (console or VNC input, a QMP command) may be up to
// subresources.MaxClientMessage (1 MiB), qvirt-api's limit too; a larger one closes the stream
// with 1009.
//
// Close codes the handler sends: 1000 when QEMU closed the socket (the VM stopped), 1001 when the
// handler shuts down, 4001 when taken over; 1008 for a QMP client that lets more than 1024 replies
// pile up unread. The handler pings every PingInterval and drops a peer that does not answer
// within PingTimeout.
//
// # QMP shell
//
// One QMP JSON message per websocket text frame, both ways. The handler connects to QEMU's second
// monitor (launcher.Dir.ShellQMP) and negotiates capabilities itself (qmp_capabilities without
// out-of-band execution), so it alone decides what reaches QEMU. To the client it looks like QEMU:
// the first frame is QEMU's greeting (with an empty capability list), the client sends
// qmp_capabilities, which the handler answers itself, and commands sent before that get QEMU's
// CommandNotFound error. Replies keep QEMU's order, including the handler's own; events from QEMU
// are passed through as they come. Replies can exceed coder/websocket's default 32 KiB read limit
// (query-qmp-schema does): clients should raise it (Conn.SetReadLimit).
//
// The shell is read-only unless X-Qvirt-QMP-Write is true: read-only callers may run query-*
// commands, qom-list, qom-get, qom-list-types and human-monitor-command with "info ITEM" for a
// fixed list of items that show configuration and state but not guest memory or registers
// (status, version, cpus, block, blockstats, chardev, network, pci, qtree, migrate, ...; the list is
// readOnlyHMPInfo in qmpfilter.go). Any other command is refused with a QMP
// error reply (class GenericError, desc naming the command and why); the session stays up.
// Every message is re-encoded before it is forwarded: what QEMU receives is exactly what was
// checked. Every forwarded and refused command is logged with the user, groups and VMI, and every
// reply with its error class if any.
//
// QEMU's shell monitor takes one client at a time: a second QMP session on the same VMI is refused
// with 409 naming the user holding it.
package streams
