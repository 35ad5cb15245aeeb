package launcher

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// qemuImg runs qemu-img and returns its output, failing the test on error.
func qemuImg(t *testing.T, args ...string) []byte {
	t.Helper()
	out, err := exec.Command("qemu-img", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-img %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return out
}

// The overlay the launcher writes is a qcow2 image QEMU's own checker finds clean, of the backing
// image's virtual size, naming the backing file and its format, with nothing allocated: every read
// goes to the backing image until the guest writes.
func TestOverlayIsACleanQcow2OverItsBacking(t *testing.T) {
	dir := t.TempDir()
	raw := filepath.Join(dir, "base.img")
	if err := os.WriteFile(raw, make([]byte, 3*1024*1024+100), 0o600); err != nil { // not a whole number of sectors
		t.Fatal(err)
	}
	qcow := filepath.Join(dir, "base.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", qcow, "1T") // an L1 table of 2048 entries

	for _, base := range []DiskImage{{Path: raw, Format: "raw"}, {Path: qcow, Format: "qcow2"}} {
		t.Run(base.Format, func(t *testing.T) {
			size, err := imageVirtualSize(&base)
			if err != nil {
				t.Fatal(err)
			}
			overlay := filepath.Join(dir, "overlay-"+base.Format+".qcow2")
			if err := os.WriteFile(overlay, []byte("a stale overlay of an earlier start"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := createOverlay(overlay, &base, size); err != nil {
				t.Fatal(err)
			}
			qemuImg(t, "check", "-q", "-f", "qcow2", overlay)
			var info struct {
				VirtualSize    uint64 `json:"virtual-size"`
				BackingFile    string `json:"backing-filename"`
				BackingFormat  string `json:"backing-filename-format"`
				ClusterSize    int    `json:"cluster-size"`
				FormatSpecific struct {
					Data struct {
						Compat string `json:"compat"`
					} `json:"data"`
				} `json:"format-specific"`
			}
			// -U: no lock, and the backing file is not opened (qemu-img info does not follow it
			// without --backing-chain).
			if err := json.Unmarshal(qemuImg(t, "info", "-U", "--output=json", "-f", "qcow2", overlay), &info); err != nil {
				t.Fatal(err)
			}
			want := (size + 511) &^ 511
			if info.VirtualSize != want || info.BackingFile != base.Path || info.BackingFormat != base.Format ||
				info.ClusterSize != 65536 || info.FormatSpecific.Data.Compat != "1.1" {
				t.Errorf("qemu-img info: %+v; want a qcow2 v3 of %d bytes over %s (%s)", info, want, base.Path, base.Format)
			}
			var alloc []struct {
				Data bool `json:"data"`
				Zero bool `json:"zero"`
			}
			// The overlay alone (no backing): nothing is allocated in it.
			opts, _ := json.Marshal(map[string]any{"driver": "qcow2", "file": map[string]string{"driver": "file", "filename": overlay}, "backing": nil})
			out := qemuImg(t, "map", "--output=json", "-U", "json:"+string(opts))
			if err := json.Unmarshal(out, &alloc); err != nil {
				t.Fatal(err)
			}
			if len(alloc) == 0 {
				t.Fatalf("qemu-img map printed no extents: %s", out)
			}
			for _, a := range alloc {
				if a.Data {
					t.Fatalf("the new overlay has allocated data: %s", out)
				}
			}
			if left, _ := filepath.Glob(filepath.Join(dir, ".overlay-*")); len(left) != 0 {
				t.Errorf("temporary files left: %v", left)
			}
		})
	}
}

// qcow2Header is a valid version 3 header to change one thing in.
func qcow2Header() []byte {
	l, err := newOverlayLayout(1<<30, "/base.img", "raw")
	if err != nil {
		panic(err)
	}
	h, err := l.header()
	if err != nil {
		panic(err)
	}
	return h
}

func TestParseQcow2Header(t *testing.T) {
	be := binary.BigEndian
	set32 := func(off int, v uint32) func([]byte) []byte {
		return func(b []byte) []byte { be.PutUint32(b[off:], v); return b }
	}
	set64 := func(off int, v uint64) func([]byte) []byte {
		return func(b []byte) []byte { be.PutUint64(b[off:], v); return b }
	}
	cases := []struct {
		name   string
		change func([]byte) []byte
		want   string // "" for accepted
	}{
		{"valid", func(b []byte) []byte { return b }, ""},
		{"version 2, shorter header", func(b []byte) []byte { be.PutUint32(b[4:], 2); return b[:qcow2HeaderV2] }, ""},
		{"dirty and corrupt flags only", set64(72, qcow2Dirty|qcow2Corrupt), ""},
		{"empty file", func([]byte) []byte { return nil }, "shorter than a qcow2 header"},
		{"raw data", func([]byte) []byte { return bytes.Repeat([]byte("x"), 512) }, "no qcow2 magic"},
		{"version 3 cut short", func(b []byte) []byte { return b[:90] }, "cut short"},
		{"version 4", set32(4, 4), "qcow2 version 4"},
		{"cluster size 256 B", set32(20, 8), "cluster size"},
		{"cluster size 4 MiB", set32(20, 22), "cluster size"},
		{"no size", set64(24, 0), "virtual size 0"},
		{"too large", set64(24, maxVirtualSize+1), "virtual size"},
		{"external data file", set64(72, qcow2DataFile), "external data file"},
		{"unknown feature", set64(72, 1<<40), "unknown incompatible features 0x10000000000"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, err := ParseQcow2Header(bytes.NewReader(c.change(qcow2Header())))
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want == "" && (h.Size != 1<<30 || !h.BackingFile):
				t.Fatalf("header %+v, want 1 GiB naming a backing file", h)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("err = %v, want one saying %q", err, c.want)
			}
		})
	}
}

// The parser reads untrusted bytes: it must never panic, and what it accepts is within the
// bounds the overlay writer takes.
func FuzzParseQcow2Header(f *testing.F) {
	f.Add(qcow2Header())
	f.Add(qcow2Header()[:qcow2HeaderV2])
	f.Add([]byte("QFI\xfb"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseQcow2Header(bytes.NewReader(b))
		if err != nil {
			return
		}
		if h.Size == 0 || h.Size > maxVirtualSize || h.IncompatibleFeatures&qcow2DataFile != 0 {
			t.Fatalf("accepted %+v", h)
		}
		if _, err := newOverlayLayout(h.Size, "/b", "qcow2"); err != nil {
			t.Fatalf("accepted a size the overlay cannot take: %v", err)
		}
	})
}
