package netsetup

import (
	"crypto/sha256"
	"fmt"
)

// StableMAC is the MAC of interface ifaceName of the VMI with UID vmiUID when the spec gives none:
// derived by hashing, so the guest keeps it across restarts and migrations (the UID of a VMI does
// not change when it migrates). It is a locally administered unicast address, 02:xx:xx:xx:xx:xx.
func StableMAC(vmiUID, ifaceName string) string {
	sum := sha256.Sum256([]byte("qvirt-mac\x00" + vmiUID + "\x00" + ifaceName))
	return fmt.Sprintf("02:%02x:%02x:%02x:%02x:%02x", sum[0], sum[1], sum[2], sum[3], sum[4])
}
