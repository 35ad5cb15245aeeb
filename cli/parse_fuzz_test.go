package cli

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzParseJSONArgs: whatever the input, the parser either refuses it or yields one compact JSON
// object that decodes as an object.
func FuzzParseJSONArgs(f *testing.F) {
	for _, s := range []string{`{}`, `{"a": 1}`, `{"device": "vda", "size": 1e9}`, `[1]`, `null`, `{bad`, `{"a":1}}`, `{"a":1} {"b":2}`, ``, `"x"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out, err := parseJSONArgs(s)
		if err != nil {
			if !strings.Contains(err.Error(), "JSON") && !strings.Contains(err.Error(), "unexpected data") {
				t.Errorf("error %q does not say what is wrong", err)
			}
			return
		}
		if out == nil {
			if strings.TrimSpace(s) != "" {
				t.Errorf("non-empty %q accepted as no arguments", s)
			}
			return
		}
		var obj map[string]any
		if err := json.Unmarshal(out, &obj); err != nil || obj == nil {
			t.Errorf("%q accepted as %q, which is not an object: %v", s, out, err)
		}
	})
}

// FuzzShellCommand: a shell line either fails or yields a valid command name and object args.
func FuzzShellCommand(f *testing.F) {
	for _, s := range []string{`query-status`, `query-status {"a":1}`, `{"execute":"stop"}`, `{"execute":"x","arguments":[1]}`, `bad name {}`, `{`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		cmd, args, err := shellCommand(s)
		if err != nil {
			return
		}
		if checkCommandName(cmd) != nil {
			t.Errorf("%q gave invalid command %q", s, cmd)
		}
		if args != nil && !json.Valid(args) {
			t.Errorf("%q gave invalid arguments %q", s, args)
		}
	})
}

// FuzzParseSize: an accepted size is a positive whole number of bytes.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"1Gi", "512Mi", "1000", "1.5Gi", "0", "-1Gi", "1m", "8Ei", "lots", "1e3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q, err := parseSize(s)
		if err != nil {
			return
		}
		v, ok := q.AsInt64()
		if !ok || v <= 0 {
			t.Errorf("%q accepted as %v (int64 %d, %v)", s, q.String(), v, ok)
		}
	})
}

func TestParseSize(t *testing.T) {
	for s, want := range map[string]int64{"1Gi": 1 << 30, "512Mi": 512 << 20, "1000": 1000, "1G": 1e9, " 2Ki ": 2048} {
		q, err := parseSize(s)
		if v, _ := q.AsInt64(); err != nil || v != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", s, v, err, want)
		}
	}
	for _, s := range []string{"0", "-1Gi", "1m", "0.5", "lots", ""} {
		if _, err := parseSize(s); err == nil {
			t.Errorf("parseSize(%q) accepted", s)
		}
	}
}
