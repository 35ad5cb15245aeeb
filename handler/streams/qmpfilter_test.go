package streams

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestFilterQMP(t *testing.T) {
	for _, tc := range []struct {
		name  string
		msg   string
		write bool
		kind  verdictKind
		cmd   string
		wire  string // for forward
		why   string // substring, for refuse and malformed
	}{
		{"query read-only", `{"execute":"query-status","id":1}`, false, forward, "query-status", `{"execute":"query-status","id":1}`, ""},
		{"qom-get read-only", `{"execute":"qom-get","arguments":{"path":"/machine","property":"type"}}`, false, forward, "qom-get", `{"execute":"qom-get","arguments":{"path":"/machine","property":"type"}}`, ""},
		{"stop read-only", `{"execute":"stop","id":"x"}`, false, refuse, "stop", "", `"stop" is not read-only: it needs update on virtualmachineinstances/qmp-write (subresources.qvirt.io)`},
		{"stop with write", `{"execute":"stop","id":"x"}`, true, forward, "stop", `{"execute":"stop","id":"x"}`, ""},
		{"capabilities", `{"execute":"qmp_capabilities"}`, false, capabilities, "qmp_capabilities", "", ""},
		{"duplicate execute: the last one is what is checked and sent", `{"execute":"query-status","execute":"stop"}`, false, refuse, "stop", "", "stop"},
		{"duplicate execute with write: only the checked one is sent", `{"execute":"stop","execute":"query-status"}`, true, forward, "query-status", `{"execute":"query-status"}`, ""},
		{"other casing is not execute", `{"Execute":"stop"}`, true, malformed, "", "", "'Execute' is unexpected"},
		{"exec-oob", `{"exec-oob":"stop"}`, true, refuse, "", "", "out-of-band"},
		{"no execute", `{"id":3}`, true, malformed, "", "", "lacks member 'execute'"},
		{"execute not a string", `{"execute":["stop"]}`, true, malformed, "", "", "must be a string"},
		{"NUL in the name", `{"execute":"query-status\u0000stop"}`, false, malformed, "", "", "not a QMP command name"},
		{"arguments not an object", `{"execute":"query-status","arguments":[1]}`, true, malformed, "query-status", "", "'arguments' must be an object"},
		{"two messages in one frame", `{"execute":"query-status"}{"execute":"stop"}`, true, malformed, "", "", "JSON parse error"},
		{"not an object", `"stop"`, true, malformed, "", "", "JSON parse error"},
		{"null", `null`, true, malformed, "", "", "JSON parse error"},
		{"hmp info status", `{"execute":"human-monitor-command","arguments":{"command-line":"  info   status "}}`, false, forward, "human-monitor-command",
			`{"execute":"human-monitor-command","arguments":{"command-line":"  info   status "}}`, ""},
		{"hmp info registers", `{"execute":"human-monitor-command","arguments":{"command-line":"info registers"}}`, false, refuse, "human-monitor-command", "", "info registers"},
		{"hmp info with a second command", `{"execute":"human-monitor-command","arguments":{"command-line":"info status\nstop"}}`, false, refuse, "human-monitor-command", "", "qmp-write"},
		{"hmp other", `{"execute":"human-monitor-command","arguments":{"command-line":"system_reset"}}`, false, refuse, "human-monitor-command", "",
			`"system_reset" is not read-only: it needs update on virtualmachineinstances/qmp-write (subresources.qvirt.io)`},
		{"hmp duplicate command-line", `{"execute":"human-monitor-command","arguments":{"command-line":"system_reset","command-line":"info status"}}`, false, forward, "human-monitor-command",
			`{"execute":"human-monitor-command","arguments":{"command-line":"info status"}}`, ""},
		{"big numbers survive", `{"execute":"query-x","arguments":{"n":18446744073709551615},"id":1e400}`, false, forward, "query-x",
			`{"execute":"query-x","arguments":{"n":18446744073709551615},"id":1e400}`, ""},
		{"screendump writes host files", `{"execute":"screendump","arguments":{"filename":"/etc/passwd"}}`, false, refuse, "screendump", "", "qmp-write"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := filterQMP([]byte(tc.msg), tc.write)
			if v.kind != tc.kind || v.cmd != tc.cmd {
				t.Fatalf("kind %d cmd %q (%s), want kind %d cmd %q", v.kind, v.cmd, v.why, tc.kind, tc.cmd)
			}
			if tc.kind == forward && string(v.wire) != tc.wire {
				t.Fatalf("sends %s, want %s", v.wire, tc.wire)
			}
			if !strings.Contains(v.why, tc.why) {
				t.Fatalf("why %q, want it to contain %q", v.why, tc.why)
			}
		})
	}
}

// FuzzFilterQMP checks the filter's promises on any input: it never forwards a write command for
// a read-only caller, what it forwards is a single well-formed command naming exactly the checked
// command, and filtering what it forwards gives the same bytes back.
func FuzzFilterQMP(f *testing.F) {
	for _, s := range []string{
		`{"execute":"query-status","id":1}`, `{"execute":"stop"}`, `{"execute":"qmp_capabilities"}`,
		`{"execute":"query-status","execute":"stop"}`, `{"exec-oob":"stop"}`, `{"Execute":"stop"}`,
		`{"execute":"human-monitor-command","arguments":{"command-line":"info status"}}`,
		`{"execute":"human-monitor-command","arguments":{"command-line":"info status","command-line":"quit"}}`,
		`{"execute":"qom-get","arguments":{"path":"/machine","property":"type"},"id":{"a":[1,2]}}`,
		`{"execute":"query-\u0000"}`, `{"execute":"query-status"} {"execute":"stop"}`, `[]`, `null`, `{`,
		"{\"execute\":\"query-st\xffatus\"}",
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, msg []byte, write bool) {
		v := filterQMP(msg, write)
		switch v.kind {
		case forward:
			checkForwarded(t, v, write)
		case capabilities:
			if v.cmd != "qmp_capabilities" || v.wire != nil {
				t.Fatalf("capabilities verdict for %q: %+v", msg, v)
			}
		case refuse, malformed:
			if v.why == "" || v.wire != nil {
				t.Fatalf("%d verdict without a reason or with wire bytes: %+v", v.kind, v)
			}
		default:
			t.Fatalf("unknown verdict kind %d", v.kind)
		}
		if v.id != nil && !json.Valid(v.id) {
			t.Fatalf("id %q is not valid JSON", v.id)
		}
		// Write permission never allows less.
		if ro := filterQMP(msg, false); ro.kind == forward {
			if rw := filterQMP(msg, true); rw.kind != forward || !bytes.Equal(rw.wire, ro.wire) {
				t.Fatalf("allowed read-only but %+v with write", rw)
			}
		}
	})
}

func checkForwarded(t *testing.T, v verdict, write bool) {
	t.Helper()
	if !write {
		line, _ := v.args["command-line"].(string)
		f := strings.Fields(line)
		hmpInfo := v.cmd == "human-monitor-command" && len(f) == 2 && f[0] == "info" && slices.Contains(readOnlyHMPInfo, f[1])
		if !strings.HasPrefix(v.cmd, "query-") && !slices.Contains(readOnlyCommands, v.cmd) && !hmpInfo {
			t.Fatalf("read-only caller allowed %q (%s)", v.cmd, v.wire)
		}
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(v.wire, &top); err != nil {
		t.Fatalf("forwarded bytes %q are not one JSON object: %v", v.wire, err)
	}
	for k := range top {
		if k != "execute" && k != "arguments" && k != "id" {
			t.Fatalf("forwarded member %q in %s", k, v.wire)
		}
	}
	var cmd string
	if err := json.Unmarshal(top["execute"], &cmd); err != nil || cmd != v.cmd {
		t.Fatalf("forwarded execute %s, checked %q", top["execute"], v.cmd)
	}
	if keys := topKeys(t, v.wire); len(keys) != len(top) {
		t.Fatalf("forwarded bytes repeat a member: %v in %s", keys, v.wire)
	}
	again := filterQMP(v.wire, write)
	if again.kind != forward || !bytes.Equal(again.wire, v.wire) {
		t.Fatalf("re-filtering %s gives %+v", v.wire, again)
	}
}

// topKeys lists the members of a JSON object as written, duplicates included.
func topKeys(t *testing.T, data []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	var keys []string
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return keys
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
			continue
		case json.Delim('}'), json.Delim(']'):
			depth--
			continue
		}
		if k, ok := tok.(string); ok && depth == 1 && dec.More() {
			keys = append(keys, k)
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				t.Fatalf("member %q of %s: %v", k, data, err)
			}
		}
	}
}
