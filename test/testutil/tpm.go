package testutil

import (
	"regexp"
	"testing"
	"time"
)

// readClockCmd sends TPM2_ReadClock through /dev/tpm0 and prints its response code and the TPM's
// resetCount (the number of TPM Resets, a power-on each, since the TPM was made): RC-[rc:count],
// both in hex. The response is a 10-byte header, time and clock (8 bytes each), then resetCount.
// The command goes through dd in one write: its size byte is a newline, where printf may split
// its output, and the TPM takes a command only whole.
const readClockCmd = `exec 3<>/dev/tpm0; printf '\200\001\000\000\000\012\000\000\001\201' | dd ibs=1 obs=10 count=10 2>/dev/null >&3; ` +
	`x=$(dd bs=35 count=1 <&3 2>/dev/null | od -An -tx1 | tr -d ' \n'); exec 3<&-; ` +
	`echo "RC""-[$(echo $x | cut -c13-20):$(echo $x | cut -c53-60)]"`

var resetCount = regexp.MustCompile(`RC-\[00000000:([0-9a-f]{8})\]`)

// TPMResetCount asks the test guest's TPM for its resetCount (TPM2_ReadClock through the shell on
// console c), in hex: a TPM that keeps its state counts up at each power-on; a new one starts at 1.
func TPMResetCount(t testing.TB, c *Console) string {
	t.Helper()
	from := len(c.Text())
	c.Send(t, readClockCmd)
	deadline := time.Now().Add(time.Minute)
	for {
		if m := resetCount.FindStringSubmatch(c.Text()[from:]); m != nil {
			return m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no successful TPM2_ReadClock answer; the console shows %q", c.Text()[from:])
		}
		time.Sleep(100 * time.Millisecond)
	}
}
