// Package certs makes and serves the certificates of the mutual TLS links qvirt runs itself:
// qvirt-api (client) → qvirt-handler's stream server (server), and qvirt-handler (client) →
// another node's qvirt-handler migration endpoint (server, handler/migproxy). It has pure functions to make a
// CA and leaves (ECDSA P-256), encode and decode them as PEM, and decide when one must be
// replaced; a Source that watches one Secret; and the server and client tls.Configs built on it.
// The reconciler that keeps the Secrets is controllers/certs, in qvirt-controller.
//
// # Secrets
//
// All three live in qvirt's install namespace (qvirt-system), have type kubernetes.io/tls and
// carry the label qvirt.io/certificates (ca, handler, api), which the controller's watch selects.
//
//	Secret               tls.crt                         tls.key      ca.crt (trust bundle)     read by
//	qvirt-ca             CA certificate (CN qvirt-ca)    CA key       current CA [+ previous]   qvirt-controller only
//	qvirt-handler-certs  leaf, CN and DNS SAN            leaf key     current CA [+ previous]   every qvirt-handler
//	                     qvirt-handler, serverAuth and
//	                     clientAuth
//	qvirt-api-certs      client leaf, CN qvirt-api,      leaf key     current CA [+ previous]   qvirt-api
//	                     clientAuth
//
// The handler serves with tls.crt/tls.key and requires a client certificate that chains to its
// ca.crt and names qvirt-api (ServerConfig with allowed client qvirt-api). qvirt-api presents its
// tls.crt/tls.key and accepts a server whose chain verifies against its ca.crt and whose CN or
// DNS SAN is qvirt-handler (ClientConfig with server name qvirt-handler). The address qvirt-api
// dials, a node IP from the node's annotation, is not checked: no certificate could name every
// node's IP, and the CA is private to this link, so "signed by our CA and named qvirt-handler"
// is the identity. Between node agents the same holds both ways, with qvirt-handler as the only
// client name the migration endpoint accepts (qvirt-api's certificate is refused there). Nobody but the controller reads qvirt-ca (it holds the CA key); RBAC can
// limit each reader to its one Secret by name (resourceNames), since Source lists and watches
// with the field selector metadata.name.
//
// A peer reads its Secret either with a Source (an informer on that one Secret; a change takes
// effect at the next handshake, within about a second) or from a mounted Secret volume (the
// handler's file mode, handler/streams; the kubelet refreshes the files within a minute or two).
//
// # Lifetimes and rotation
//
// Defaults: CA one year, leaves 30 days, trust delay 10 minutes (controllers/certs.Reconciler
// sets them). A certificate is replaced at 80% of its lifetime (RenewAt); a leaf also when it is
// not signed by the current CA, does not carry the wanted names or usages, or does not parse
// (then an Event of reason CertificateRepaired names the Secret and the key). A leaf never
// outlives its CA (Issue cuts it). The controller requeues itself at the next deadline; it does
// not poll.
//
// CA rotation must not cut anyone off, so it happens in three steps, each reaching every peer
// before the next:
//
//  1. At 80% of the CA's lifetime (or when qvirt-ca is lost), the controller makes a new CA and
//     writes ca.crt = [new, old] into all three Secrets. Leaves stay signed by the old CA. Peers
//     pick up the bundle and now trust both.
//  2. After the trust delay (default 10 minutes, enough for Secret volumes to refresh), the
//     leaves are reissued by the new CA. A peer that has not reloaded yet still presents its old
//     leaf, which the others accept, because the old CA is in their bundle.
//  3. One leaf lifetime after the rotation, no valid leaf of the old CA can exist: the old CA
//     leaves every ca.crt.
//
// The timeline for the defaults: day 0 CA1; day 292 CA2 made, bundles [CA2, CA1]; day 292 + 10
// minutes leaves from CA2; day 322 bundles [CA2]; CA1 would have expired on day 365.
//
// # Rotating by hand
//
// Delete the Secret; the controller recreates it at once (an Event of reason CertificateCreated
// says so).
//
//   - kubectl -n qvirt-system delete secret qvirt-handler-certs (or qvirt-api-certs): a new leaf
//     from the same CA; nothing else changes, peers accept it as soon as its holder reloads.
//   - kubectl -n qvirt-system delete secret qvirt-ca: a CA rotation exactly as above (the old CA
//     is recovered from the leaves' bundles and kept for the overlap), for example after the CA
//     key may have leaked. The old CA stays trusted for the overlap (one leaf lifetime): there is
//     no immediate revocation; lower the leaf lifetime if that window matters.
package certs
