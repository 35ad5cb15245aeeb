package streams

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	subresources "github.com/qvirt/qvirt/api/subresources/v1alpha1"
)

// The QMP shell's command filter. It is the security boundary between a read-only user and QEMU,
// so it never forwards what it checked: it parses the client's message, decides on the parsed
// form, and re-encodes that form, and only those bytes reach QEMU. Duplicate keys, odd casing
// and trailing data therefore cannot make QEMU see something other than what was allowed.

// verdictKind is what the proxy does with one client message.
type verdictKind int

const (
	// forward sends verdict.wire to QEMU.
	forward verdictKind = iota
	// capabilities is qmp_capabilities, which the proxy answers itself.
	capabilities
	// refuse answers a well-formed command the caller may not run with a QMP error.
	refuse
	// malformed answers a message that is not a QMP command with a QMP error.
	malformed
)

// verdict is the filter's decision on one client message.
type verdict struct {
	kind verdictKind
	// cmd is the command name ("" when there is none).
	cmd string
	// id is the client's id, echoed in the reply; nil when absent.
	id json.RawMessage
	// args are the command's arguments (numbers as json.Number).
	args map[string]any
	// wire is the re-encoded command for QEMU (forward only).
	wire []byte
	// why explains a refusal or what is malformed.
	why string
}

// readOnlyCommands are the commands besides query-* that read-only callers may run: they read
// QOM properties and types and change nothing.
var readOnlyCommands = []string{"qom-get", "qom-list", "qom-list-types"}

// readOnlyHMPInfo are the HMP "info" items read-only callers may ask for through
// human-monitor-command. A fixed list rather than every item: some (registers, mem, tlb) expose
// guest memory contents, which the read-only permission does not grant.
var readOnlyHMPInfo = []string{
	"balloon", "block", "blockstats", "chardev", "cpus", "hotpluggable-cpus", "iothreads", "kvm",
	"memdev", "memory-devices", "migrate", "migrate_capabilities", "migrate_parameters", "name",
	"network", "numa", "pci", "qtree", "status", "uuid", "version", "vnc",
}

// filterQMP decides what to do with one client message; write is the caller's write permission.
func filterQMP(msg []byte, write bool) verdict {
	v, ok := parseQMP(msg)
	if !ok {
		return v
	}
	if v.cmd == "qmp_capabilities" {
		v.kind = capabilities
		return v
	}
	if !write {
		if why, ok := readOnlyAllows(v.cmd, v.args); !ok {
			v.kind, v.why = refuse, why
			return v
		}
	}
	wire, err := json.Marshal(struct {
		Execute   string          `json:"execute"`
		Arguments map[string]any  `json:"arguments,omitempty"`
		ID        json.RawMessage `json:"id,omitempty"`
	}{v.cmd, v.args, v.id})
	if err != nil {
		// Everything in v came out of the JSON decoder, so this does not happen.
		return verdict{kind: malformed, id: v.id, cmd: v.cmd, why: "cannot re-encode the command: " + err.Error()}
	}
	v.kind, v.wire = forward, wire
	return v
}

// parseQMP reads a QMP command object. On failure the verdict is malformed (or refuse for
// exec-oob) with the reason in QEMU's words where QEMU has them.
func parseQMP(msg []byte) (verdict, bool) {
	bad := func(v verdict, kind verdictKind, format string, a ...any) (verdict, bool) {
		v.kind, v.why = kind, fmt.Sprintf(format, a...)
		return v, false
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(msg, &top); err != nil || top == nil {
		return bad(verdict{}, malformed, "JSON parse error: a QMP message is one JSON object per frame")
	}
	v := verdict{}
	if id, ok := top["id"]; ok {
		v.id = canonical(id)
	}
	keys := make([]string, 0, len(top))
	for k := range top {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		switch k {
		case "execute", "arguments", "id":
		case "exec-oob":
			return bad(v, refuse, "out-of-band execution (exec-oob) is not offered by the QMP shell")
		default:
			return bad(v, malformed, "QMP input member '%s' is unexpected", k)
		}
	}
	raw, ok := top["execute"]
	if !ok {
		return bad(v, malformed, "QMP input lacks member 'execute'")
	}
	var cmd string
	if err := json.Unmarshal(raw, &cmd); err != nil {
		return bad(v, malformed, "QMP input member 'execute' must be a string")
	}
	if !validName(cmd) {
		return bad(v, malformed, "%q is not a QMP command name", cmd)
	}
	v.cmd = cmd
	if raw, ok := top["arguments"]; ok {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&v.args); err != nil || v.args == nil {
			return bad(v, malformed, "QMP input member 'arguments' must be an object")
		}
	}
	return v, true
}

// validName accepts QAPI command names: letters, digits, '-' and '_'.
func validName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// canonical re-encodes a JSON value (numbers kept as written, invalid UTF-8 replaced), so what
// QEMU echoes is well-formed whatever the client sent.
func canonical(raw json.RawMessage) json.RawMessage {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var x any
	if err := dec.Decode(&x); err != nil {
		return nil
	}
	out, err := json.Marshal(x)
	if err != nil {
		return nil
	}
	return out
}

// readOnlyAllows says whether a caller without write permission may run cmd, and why not.
func readOnlyAllows(cmd string, args map[string]any) (string, bool) {
	if strings.HasPrefix(cmd, "query-") || slices.Contains(readOnlyCommands, cmd) {
		return "", true
	}
	if cmd == "human-monitor-command" {
		line, _ := args["command-line"].(string)
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == "info" && slices.Contains(readOnlyHMPInfo, f[1]) {
			return "", true
		}
		return fmt.Sprintf("human-monitor-command %q is not read-only: it needs %s; without it only \"info ITEM\" runs, for ITEM in %s",
			line, writePermission, strings.Join(readOnlyHMPInfo, ", ")), false
	}
	return fmt.Sprintf("%q is not read-only: it needs %s; without it the QMP shell runs only query-* commands, %s and human-monitor-command \"info ITEM\"",
		cmd, writePermission, strings.Join(readOnlyCommands, ", ")), false
}

// writePermission is the RBAC permission qvirt-api checks before it sets X-Qvirt-QMP-Write, in
// the words of a Role rule, so a refused user knows what to ask their administrator for.
var writePermission = fmt.Sprintf("update on %s/%s (%s)",
	subresources.VirtualMachineInstances, subresources.QMPWrite, subresources.GroupVersion.Group)
