package guestagent

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"
)

// FuzzParseReply feeds arbitrary reply lines through the reply parser and every decoder: none
// may panic, and what they return stays within the bounds.
func FuzzParseReply(f *testing.F) {
	f.Add([]byte(`{"return": [{"name": "eth0", "hardware-address": "52:54:00:12:34:56", "ip-addresses": [{"ip-address-type": "ipv4", "ip-address": "10.0.2.15", "prefix": 24}]}]}`))
	f.Add([]byte(`{"return": {"id": "debian", "pretty-name": "Debian", "kernel-release": "6.1"}}`))
	f.Add([]byte(`{"return": {"version": "7.2.22", "supported_commands": [{"enabled": true, "name": "guest-ping"}]}}`))
	f.Add([]byte(`{"return": [{"user": "root", "login-time": 1.5e9}]}`))
	f.Add([]byte(`{"return": [{"name": "vda1", "mountpoint": "/", "type": "ext4", "used-bytes": 1, "total-bytes": 2, "disk": [{"serial": "x", "bus-type": "virtio"}]}]}`))
	f.Add([]byte(`{"error": {"class": "GenericError", "desc": "no"}}`))
	f.Add([]byte("\xff{\"return\": 1}"))
	f.Add([]byte(`{"return": {"exited": true, "exitcode": 1, "out-data": "aGkK", "err-data": "", "out-truncated": false}}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		raw, err := ParseReply(line)
		if err != nil {
			return
		}
		if info, err := DecodeInfo(raw); err == nil {
			checkStrings(t, append([]string{info.Version}, info.Commands...)...)
			checkLen(t, len(info.Commands))
		}
		if o, err := DecodeOSInfo(raw); err == nil {
			checkStrings(t, o.ID, o.Name, o.PrettyName, o.Version, o.VersionID, o.Variant, o.VariantID, o.KernelRelease, o.KernelVersion, o.Machine)
		}
		if ifs, err := DecodeInterfaces(raw); err == nil {
			checkLen(t, len(ifs))
			for _, i := range ifs {
				checkStrings(t, i.Name, i.MAC)
				checkLen(t, len(i.Addresses))
				for _, a := range i.Addresses {
					if !a.IP.IsValid() || a.Prefix < 0 || a.Prefix > a.IP.BitLen() {
						t.Errorf("bad address %v/%d", a.IP, a.Prefix)
					}
				}
			}
		}
		if us, err := DecodeUsers(raw); err == nil {
			checkLen(t, len(us))
			for _, u := range us {
				checkStrings(t, u.Name, u.Domain)
			}
		}
		if fss, err := DecodeFilesystems(raw); err == nil {
			checkLen(t, len(fss))
			for _, fs := range fss {
				checkStrings(t, fs.Name, fs.Mountpoint, fs.Type)
				checkLen(t, len(fs.Disks))
			}
		}
		if st, err := DecodeExecStatus(raw); err == nil && (len(st.Stdout) > MaxExecOutput || len(st.Stderr) > MaxExecOutput) {
			t.Errorf("exec output of %d and %d bytes passed the cap %d", len(st.Stdout), len(st.Stderr), MaxExecOutput)
		}
	})
}

func checkStrings(t *testing.T, ss ...string) {
	for _, s := range ss {
		if len(s) > MaxString || !utf8.ValidString(s) {
			t.Errorf("string of %d bytes (valid UTF-8: %v) passed the bounds", len(s), utf8.ValidString(s))
		}
	}
}

func checkLen(t *testing.T, n int) {
	if n > MaxItems {
		t.Errorf("list of %d passed the cap %d", n, MaxItems)
	}
}

// FuzzFirstItems checks the capped list's decoding against a plain decode: for any valid JSON
// array, its first n elements, byte for byte; for any other valid JSON, an error. n is small, so
// that the fuzzer reaches the cut with short inputs.
func FuzzFirstItems(f *testing.F) {
	f.Add([]byte(`[1, "a,b", {"c": [2, 3]}, "\"]", "\\", []]`), uint8(2))
	f.Add([]byte(`[{"x": ","}, {"y": "\\\","}, 0]`), uint8(1))
	f.Add([]byte(`{"not": "a list"}`), uint8(0))
	f.Add([]byte(`null`), uint8(0))
	f.Fuzz(func(t *testing.T, b []byte, k uint8) {
		b = bytes.TrimSpace(b) // as encoding/json hands an Unmarshaler its value
		if !json.Valid(b) {
			return // an Unmarshaler is given valid JSON only
		}
		n := int(k%4) + 1
		var plain []json.RawMessage
		plainErr := json.Unmarshal(b, &plain)
		before := bytes.Clone(b)
		got, err := firstItems[json.RawMessage](b, n)
		if !bytes.Equal(b, before) {
			t.Fatalf("the input changed: %s, was %s", b, before)
		}
		if (err != nil) != (plainErr != nil) {
			t.Fatalf("firstItems: %v, plain: %v", err, plainErr)
		}
		if err != nil {
			return
		}
		want := plain[:min(len(plain), n)]
		if len(got) != len(want) {
			t.Fatalf("%d elements, want %d", len(got), len(want))
		}
		for i := range want {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("element %d is %s, want %s", i, got[i], want[i])
			}
		}
	})
}
