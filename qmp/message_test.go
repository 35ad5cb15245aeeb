package qmp

import (
	"encoding/json"
	"testing"
)

func TestDecodeMessage(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		kind    msgKind
		id      string
		wantErr bool
	}{
		{name: "greeting", in: `{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}, "package": "Debian 1:7.2+dfsg-7+deb12u18+b3"}, "capabilities": ["oob"]}}`, kind: kindGreeting},
		{name: "return", in: `{"return": {"status": "prelaunch", "singlestep": false, "running": false}, "id": "7"}`, kind: kindReturn, id: "7"},
		{name: "return without id", in: `{"return": {}}`, kind: kindReturn},
		{name: "numeric id is not ours", in: `{"return": {}, "id": 7}`, kind: kindReturn},
		{name: "error", in: `{"id": "3", "error": {"class": "CommandNotFound", "desc": "The command nosuch has not been found"}}`, kind: kindError, id: "3"},
		{name: "error wins over return", in: `{"return": {}, "error": {"class": "GenericError", "desc": "x"}, "id": "1"}`, kind: kindError, id: "1"},
		{name: "event", in: `{"timestamp": {"seconds": 1795990512, "microseconds": 659186}, "event": "SHUTDOWN", "data": {"guest": false, "reason": "host-qmp-quit"}}`, kind: kindEvent},
		{name: "event without data", in: `{"event": "STOP", "timestamp": {"seconds": 1, "microseconds": 2}}`, kind: kindEvent},
		{name: "event with null data", in: `{"event": "STOP", "data": null}`, kind: kindEvent},
		{name: "event name not a string", in: `{"event": 5}`, wantErr: true},
		{name: "event with empty name", in: `{"event": ""}`, wantErr: true},
		{name: "event data not an object", in: `{"event": "X", "data": [1]}`, wantErr: true},
		{name: "error not an object", in: `{"error": "boom", "id": "1"}`, wantErr: true},
		{name: "error null", in: `{"error": null, "id": "1"}`, wantErr: true},
		{name: "greeting not an object", in: `{"QMP": 1}`, wantErr: true},
		{name: "unrecognised object", in: `{"hello": 1}`, wantErr: true},
		{name: "array", in: `[1, 2]`, wantErr: true},
		{name: "null", in: `null`, wantErr: true},
		{name: "not JSON", in: `{"return"`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg, err := decodeMessage([]byte(tt.in))
			if tt.wantErr {
				if err == nil {
					t.Fatalf("decodeMessage(%s) = %v kind, want error", tt.in, msg.kind)
				}
				return
			}
			if err != nil {
				t.Fatalf("decodeMessage(%s): %v", tt.in, err)
			}
			if msg.kind != tt.kind || msg.id != tt.id {
				t.Errorf("decodeMessage(%s) = kind %v id %q, want kind %v id %q", tt.in, msg.kind, msg.id, tt.kind, tt.id)
			}
		})
	}
}

func TestDecodeMessageFields(t *testing.T) {
	msg, err := decodeMessage([]byte(`{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}, "package": "Debian"}, "capabilities": ["oob"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if v := msg.greeting.Version; v.String() != "7.2.22" || v.Package != "Debian" {
		t.Errorf("greeting version = %s %q, want 7.2.22 \"Debian\"", v, v.Package)
	}
	if caps := msg.greeting.Capabilities; len(caps) != 1 || caps[0] != "oob" {
		t.Errorf("capabilities = %v, want [oob]", caps)
	}

	msg, err = decodeMessage([]byte(`{"event": "SHUTDOWN", "data": {"reason": "host-qmp-quit"}, "timestamp": {"seconds": 10, "microseconds": 20}}`))
	if err != nil {
		t.Fatal(err)
	}
	ev := msg.event
	if ev.Event != "SHUTDOWN" || ev.Data["reason"] != "host-qmp-quit" || ev.Timestamp.Seconds != 10 || ev.Timestamp.Microseconds != 20 {
		t.Errorf("event = %+v", ev)
	}

	msg, err = decodeMessage([]byte(`{"error": {"class": "DeviceNotFound", "desc": "no disk0"}, "id": "9"}`))
	if err != nil {
		t.Fatal(err)
	}
	if msg.err.Class != ClassDeviceNotFound || msg.err.Desc != "no disk0" {
		t.Errorf("error = %+v", msg.err)
	}
}

// FuzzDecodeMessage checks that classifying arbitrary bytes never panics and
// that whatever it accepts is consistent.
func FuzzDecodeMessage(f *testing.F) {
	seeds := []string{
		`{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}, "package": "Debian"}, "capabilities": ["oob"]}}`,
		`{"return": {}, "id": "1"}`,
		`{"return": [{"name": "query-status"}], "id": "2"}`,
		`{"return": "text", "id": 3}`,
		`{"id": "4", "error": {"class": "GenericError", "desc": "x"}}`,
		`{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "STOP"}`,
		`{"event": "DEVICE_DELETED", "data": {"device": "disk0", "path": "/machine/peripheral/disk0"}}`,
		`{"event": null}`,
		`{"error": null}`,
		`{"return": null, "id": null}`,
		`{"QMP": null}`,
		`[]`,
		`"QMP"`,
		``,
		`{`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		msg, err := decodeMessage(b)
		if err != nil {
			return
		}
		if !json.Valid(b) {
			t.Fatalf("accepted invalid JSON %q", b)
		}
		switch msg.kind {
		case kindGreeting:
		case kindReturn:
			if msg.ret == nil {
				t.Fatalf("return message without a value: %q", b)
			}
		case kindError:
			if msg.err == nil {
				t.Fatalf("error message without an error: %q", b)
			}
		case kindEvent:
			if msg.event.Event == "" {
				t.Fatalf("event without a name: %q", b)
			}
		default:
			t.Fatalf("accepted %q with kind %v", b, msg.kind)
		}
	})
}
