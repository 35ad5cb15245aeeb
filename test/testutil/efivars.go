package testutil

import (
	"fmt"
	"testing"
	"time"
)

// EFI variables in the test guest, through efivarfs: variables of a GUID of qvirt's tests, whose
// file holds 4 attribute bytes (non-volatile, boot-service and runtime access) and then the data.

const efiVarGUID = "5d2f5e4c-1b0e-4f3a-9a57-0c6e2a7d4b11"

// MountEFIVars mounts the guest's efivarfs (a module of the test guest's kernel).
func MountEFIVars(t testing.TB, c *Console) {
	t.Helper()
	c.Run(t, `modprobe efivarfs; mount -t efivarfs efivarfs /sys/firmware/efi/efivars && echo "EFIVARS-MOUNT""ED"`, "EFIVARS-MOUNTED", time.Minute)
}

// WriteEFIVar creates the variable name with data, and reads it back. A variable that existed when
// efivarfs was mounted is immutable there: write a new one.
func WriteEFIVar(t testing.TB, c *Console, name, data string) {
	t.Helper()
	c.Run(t, `printf '\007\000\000\000`+data+`' > `+efiVarFile(name)+`; `+readEFIVarCmd(name, data), "VAR-"+data, time.Minute)
}

// ExpectEFIVar reads the variable name and expects data.
func ExpectEFIVar(t testing.TB, c *Console, name, data string) {
	t.Helper()
	c.Run(t, readEFIVarCmd(name, data), "VAR-"+data, time.Minute)
}

func efiVarFile(name string) string { return "/sys/firmware/efi/efivars/" + name + "-" + efiVarGUID }

// readEFIVarCmd prints VAR-<the variable's last len(data) bytes>: the typed line does not hold
// VAR-<data>, so only the answer matches.
func readEFIVarCmd(name, data string) string {
	return fmt.Sprintf(`echo "VAR-$(tail -c %d %s 2>/dev/null)"`, len(data), efiVarFile(name))
}
