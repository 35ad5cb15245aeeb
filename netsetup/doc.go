// Package netsetup wires a guest into its launcher pod's network: netlink and nftables work done by
// the node agent inside the pod's network namespace, before the launcher starts QEMU.
//
// The masquerade binding (SetupMasquerade, the default) gives the guest a private network behind
// the pod's address, as KubeVirt does:
//
//	guest eth0 10.0.2.2/24 ── tap (persistent, owned by the launcher's uid)
//	                            │ enslaved to
//	                          bridge 10.0.2.1/24 (the guest's gateway; the launcher's DHCP server
//	                            │                 listens here)
//	                          pod routing (ip_forward on inside the pod's namespace only)
//	                            │ nftables table "ip qvirt":
//	                            │   postrouting: masquerade saddr 10.0.2.0/24 leaving other than the bridge
//	                            │   prerouting:  DNAT tcp/udp to the pod IP arriving on the pod interface
//	                            │                (the listed ports, or all ports but PodPorts) to 10.0.2.2
//	                            │   output:      DNAT the listed ports of the pod IP for the pod's own
//	                            │                connections
//	                          pod interface (eth0, the default route's), pod IP
//
// QEMU opens the tap by name (-netdev tap,ifname=...) without CAP_NET_ADMIN because the tap is
// persistent and owned by the launcher's uid; the DHCP server (launcher.ServeDHCP) hands the guest
// its address. Nothing depends on the pod IP staying the same except the DNAT rules, so the binding
// is live-migratable: the target pod gets the same layout and the guest keeps 10.0.2.2.
//
// The bridge binding (SetupBridge) hands the pod's own address to the guest instead: the pod
// interface loses its address, default route and MAC (the guest gets them over DHCP: BridgeResult)
// and becomes a port of a bridge with the tap; the bridge holds only BridgeServerIP/32 for the DHCP
// server. What was moved is recorded in the bridge's ifalias, so a repeated setup returns the same
// lease and TeardownBridge puts it back. It is not live-migratable: the address is the pod's.
//
// Every function takes the namespace as a path (/proc/PID/ns/net or /var/run/netns/NAME), enters it
// only on a locked OS thread, and leaves the caller's thread untouched. Setup is safe to repeat
// (it reuses what exists and replaces the nftables table atomically); Teardown is idempotent and
// removes the table, the tap and the bridge. Neither logs: errors say what failed.
package netsetup
