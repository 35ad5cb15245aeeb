package qmp

import (
	"encoding/json"
	"errors"
	"fmt"

	gqmp "github.com/digitalocean/go-qemu/qmp"
)

// Error classes QEMU 7.2 reports in QMP error replies.
const (
	ClassGenericError    = "GenericError"
	ClassCommandNotFound = "CommandNotFound"
	ClassDeviceNotActive = "DeviceNotActive"
	ClassDeviceNotFound  = "DeviceNotFound"
	ClassKVMMissingCap   = "KVMMissingCap"
)

// Error is a QMP error reply. Commands return it wrapped with the command
// name; use errors.As to inspect Class.
type Error struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *Error) Error() string {
	return e.Class + ": " + e.Desc
}

// msgKind classifies a message read from QEMU.
type msgKind uint8

const (
	kindInvalid msgKind = iota
	kindGreeting
	kindReturn
	kindError
	kindEvent
)

func (k msgKind) String() string {
	switch k {
	case kindGreeting:
		return "greeting"
	case kindReturn:
		return "return"
	case kindError:
		return "error"
	case kindEvent:
		return "event"
	}
	return "invalid"
}

// greeting is the body of the {"QMP": {...}} banner QEMU sends on connect.
type greeting struct {
	Version      gqmp.Version `json:"version"`
	Capabilities []string     `json:"capabilities"`
}

// message is one decoded QMP server message. Only the fields of its kind are
// set.
type message struct {
	kind     msgKind
	id       string          // reply id; "" when absent or not a JSON string
	ret      json.RawMessage // kindReturn: the "return" value
	err      *Error          // kindError
	event    gqmp.Event      // kindEvent
	greeting greeting        // kindGreeting
}

// errUnrecognised marks valid JSON that is none of the four QMP message
// kinds. The reader skips such messages rather than dropping the connection.
var errUnrecognised = errors.New("unrecognised QMP message")

// decodeMessage classifies one raw JSON value from QEMU. Presence of keys
// decides the kind, in the order QEMU's protocol defines them: a greeting
// has "QMP", an event has "event", a failed command has "error", a
// successful one has "return". It must never panic: it sees whatever the
// peer sends.
func decodeMessage(b []byte) (message, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return message{}, fmt.Errorf("decode QMP message: %w", err)
	}
	if raw, ok := fields["QMP"]; ok {
		return decodeGreeting(raw)
	}
	if _, ok := fields["event"]; ok {
		return decodeEvent(fields)
	}
	if raw, ok := fields["error"]; ok {
		return decodeErrorReply(raw, fields["id"])
	}
	if raw, ok := fields["return"]; ok {
		return message{kind: kindReturn, id: decodeID(fields["id"]), ret: raw}, nil
	}
	return message{}, errUnrecognised
}

func decodeGreeting(raw json.RawMessage) (message, error) {
	var g greeting
	if err := json.Unmarshal(raw, &g); err != nil {
		return message{}, fmt.Errorf("decode QMP greeting: %w", err)
	}
	return message{kind: kindGreeting, greeting: g}, nil
}

func decodeErrorReply(raw, id json.RawMessage) (message, error) {
	var e *Error
	if err := json.Unmarshal(raw, &e); err != nil {
		return message{}, fmt.Errorf("decode QMP error reply: %w", err)
	}
	if e == nil {
		return message{}, errors.New("decode QMP error reply: null error")
	}
	return message{kind: kindError, id: decodeID(id), err: e}, nil
}

// decodeEvent builds a go-qemu Event from the exact keys QEMU sends; it does
// not unmarshal the whole message into the struct, whose case-insensitive
// field matching would accept keys QEMU never sends.
func decodeEvent(fields map[string]json.RawMessage) (message, error) {
	var ev gqmp.Event
	if err := json.Unmarshal(fields["event"], &ev.Event); err != nil {
		return message{}, fmt.Errorf("decode QMP event name: %w", err)
	}
	if ev.Event == "" {
		return message{}, errors.New("decode QMP event: empty name")
	}
	if raw, ok := fields["data"]; ok {
		if err := json.Unmarshal(raw, &ev.Data); err != nil {
			return message{}, fmt.Errorf("decode QMP event %s data: %w", ev.Event, err)
		}
	}
	if raw, ok := fields["timestamp"]; ok {
		if err := json.Unmarshal(raw, &ev.Timestamp); err != nil {
			return message{}, fmt.Errorf("decode QMP event %s timestamp: %w", ev.Event, err)
		}
	}
	return message{kind: kindEvent, event: ev}, nil
}

// decodeID returns the reply id when it is a JSON string. This client only
// sends string ids, so anything else cannot belong to one of its commands.
func decodeID(raw json.RawMessage) string {
	var id string
	if json.Unmarshal(raw, &id) != nil {
		return ""
	}
	return id
}
