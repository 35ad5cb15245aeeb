package streams

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// maxAuditArguments bounds the arguments one audit line carries: a command may be up to
// MaxClientMessage long, and the audit must not let a client flood the log with it.
const maxAuditArguments = 4 << 10

// AuditArguments are the log key-values that say what a QMP command carried: "arguments", its
// arguments as compact JSON (cut at 4 KiB, with the full length said), and for
// human-monitor-command "commandLine", the HMP line on its own, since that line is the command.
// args is the command's "arguments" member as received (nil when absent). qvirt-api and the
// handler both audit with it, so their lines read the same.
func AuditArguments(cmd string, args []byte) []any {
	if len(bytes.TrimSpace(args)) == 0 {
		return nil
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, args); err != nil {
		compact.Reset()
		compact.Write(args)
	}
	s := compact.String()
	if len(s) > maxAuditArguments {
		s = fmt.Sprintf("%s…(%d bytes in all)", s[:maxAuditArguments], len(s))
	}
	kv := []any{"arguments", s}
	if cmd == "human-monitor-command" {
		var hmp struct {
			CommandLine string `json:"command-line"`
		}
		if json.Unmarshal(args, &hmp) == nil {
			kv = append(kv, "commandLine", truncate(hmp.CommandLine, maxAuditArguments))
		}
	}
	return kv
}
