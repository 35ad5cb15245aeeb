package netsetup

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"strings"
)

// ResolvConfDNS returns the IPv4 nameservers of a resolv.conf file (the pod's /etc/resolv.conf,
// which is per pod, not per network namespace), in order, for the guest's DHCP lease. Loopback
// servers are left out: the guest cannot reach the pod's loopback.
func ResolvConfDNS(path string) ([]netip.Addr, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var dns []netip.Addr
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 2 || fields[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(fields[1])
		if err != nil || !a.Is4() || a.IsLoopback() {
			continue
		}
		dns = append(dns, a)
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return dns, nil
}
