package qmp

import "context"

// KeyValue is one key of send-key, by QEMU key code name (QKeyCode: "ctrl", "alt", "delete",
// "a", ...).
type KeyValue struct {
	Type string `json:"type"` // "qcode"
	Data string `json:"data"`
}

// SendKey presses the keys together (in order) and releases them, on the guest's keyboard.
// QEMU 7.2 releases them after 100 ms (hold-time's default).
func (m *Monitor) SendKey(ctx context.Context, qcodes ...string) error {
	keys := make([]KeyValue, 0, len(qcodes))
	for _, k := range qcodes {
		keys = append(keys, KeyValue{Type: "qcode", Data: k})
	}
	args := struct {
		Keys []KeyValue `json:"keys"`
	}{keys}
	return m.Call(ctx, "send-key", args, nil)
}

// Image formats of screendump (QEMU 7.1 and later; "png" needs QEMU built with libpng, as
// Debian's is).
const (
	ScreendumpPPM = "ppm"
	ScreendumpPNG = "png"
)

// Screendump writes the primary display to filename, a path QEMU opens itself (so it must be
// writable by QEMU's user), in format (ScreendumpPNG or ScreendumpPPM).
func (m *Monitor) Screendump(ctx context.Context, filename, format string) error {
	args := struct {
		Filename string `json:"filename"`
		Format   string `json:"format,omitempty"`
	}{filename, format}
	return m.Call(ctx, "screendump", args, nil)
}
