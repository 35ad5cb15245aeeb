package apiserver

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/qvirt/qvirt/handler/streams"
)

// qmpAudit logs every QMP command a user sends, with its arguments and the outcome of its reply. The handler
// answers every message the client sends exactly once, in order (refusals and malformed messages
// included), and events carry no reply, so replies are matched to commands by position.
type qmpAudit struct {
	log logr.Logger

	mu      sync.Mutex
	pending []qmpCommand
}

type qmpCommand struct {
	name string
	id   json.RawMessage
	// args are the log values of the command's arguments (streams.AuditArguments).
	args []any
	sent time.Time
}

// qmpRequest is what the audit reads of a client message.
type qmpRequest struct {
	Execute   string          `json:"execute"`
	ExecOOB   string          `json:"exec-oob"`
	ID        json.RawMessage `json:"id"`
	Arguments json.RawMessage `json:"arguments"`
}

// qmpResponse is what the audit reads of a handler message.
type qmpResponse struct {
	QMP    json.RawMessage `json:"QMP"`
	Event  string          `json:"event"`
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
}

// parseQMPRequest reads the command of a client message; its name is "" for one that is not a
// QMP command (the handler answers it with an error, which is logged against it).
func parseQMPRequest(data []byte) qmpCommand {
	var req qmpRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return qmpCommand{}
	}
	name := req.Execute
	if name == "" {
		name = req.ExecOOB
	}
	return qmpCommand{name: name, id: req.ID, args: streams.AuditArguments(name, req.Arguments)}
}

func (q *qmpAudit) command(data []byte) {
	cmd := parseQMPRequest(data)
	if cmd.name == "" {
		cmd.name = "(malformed)"
	}
	cmd.sent = time.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	q.pending = append(q.pending, cmd)
}

func (q *qmpAudit) reply(data []byte) {
	var resp qmpResponse
	if json.Unmarshal(data, &resp) != nil || resp.QMP != nil || resp.Event != "" || (resp.Return == nil && resp.Error == nil) {
		return // greeting, event or something the handler passed through
	}
	q.mu.Lock()
	if len(q.pending) == 0 {
		q.mu.Unlock()
		q.log.Info("QMP reply without a command", "reply", truncate(string(data), 200))
		return
	}
	cmd := q.pending[0]
	q.pending = q.pending[1:]
	q.mu.Unlock()
	kv := []any{"command", cmd.name, "duration", time.Since(cmd.sent).Round(time.Microsecond).String()}
	if cmd.id != nil {
		kv = append(kv, "id", string(cmd.id))
	}
	kv = append(kv, cmd.args...)
	if resp.Error != nil {
		kv = append(kv, "errorClass", resp.Error.Class, "error", resp.Error.Desc)
	}
	q.log.Info("QMP command", kv...)
}

// unanswered logs the commands still waiting for a reply when the session ends.
func (q *qmpAudit) unanswered() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, c := range q.pending {
		kv := append([]any{"command", c.name}, c.args...)
		q.log.Info("QMP command", append(kv, "errorClass", "NoReply", "error", "the session ended before the reply")...)
	}
	q.pending = nil
}
