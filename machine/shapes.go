package machine

import "strings"

// The shapes of the strings a machine description puts on QEMU's command line, checked by the
// launcher and by the API's validation alike, so the two cannot disagree. They are plain byte loops
// rather than regular expressions: package regexp (330 KB of binary) and the eight expressions
// compiled at start-up (63 KB of heap, 2.4 ms) cost every launcher about 0.5 MiB of resident
// memory (BenchmarkLauncherRSS) for a handful of ASCII checks. shapes_test.go holds each one
// against the regular expression it replaces.

// asciiSet is a set of ASCII bytes.
type asciiSet [2]uint64

func charset(chars string) asciiSet {
	var s asciiSet
	for i := 0; i < len(chars); i++ {
		s[chars[i]/64] |= 1 << (chars[i] % 64)
	}
	return s
}

func (s *asciiSet) has(c byte) bool { return c < 128 && s[c/64]&(1<<(c%64)) != 0 }

// all reports whether s is made of bytes of set only (true for "").
func (set *asciiSet) all(s string) bool {
	for i := 0; i < len(s); i++ {
		if !set.has(s[i]) {
			return false
		}
	}
	return true
}

const (
	lowerDigits = "abcdefghijklmnopqrstuvwxyz0123456789"
	alnum       = lowerDigits + "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	hexDigits   = "0123456789abcdefABCDEF"
)

var (
	lowerDigitSet  = charset(lowerDigits)
	labelSet       = charset(lowerDigits + "-")
	alnumSet       = charset(alnum)
	serialSet      = charset(alnum + "_.+-")
	machineTypeSet = charset(lowerDigits + "_.-")
	tapFirstSet    = charset(alnum + "_")
	tapSet         = charset(alnum + "_.-")
	hexSet         = charset(hexDigits)
)

// IsSerial: ^[A-Za-z0-9_.+-]+$ (serial numbers of disks and of the SMBIOS table).
func IsSerial(s string) bool { return s != "" && serialSet.all(s) }

// IsLabel: ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$, a DNS-1123 label without its length limit.
func IsLabel(s string) bool {
	return s != "" && s[0] != '-' && s[len(s)-1] != '-' && labelSet.all(s)
}

// IsSubdomain: DNS-1123 labels joined by dots, without the length limits.
func IsSubdomain(s string) bool {
	for label := range strings.SplitSeq(s, ".") {
		if !IsLabel(label) {
			return false
		}
	}
	return true
}

// IsUUID: ^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$.
func IsUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch i {
		case 8, 13, 18, 23:
			if s[i] != '-' {
				return false
			}
		default:
			if !hexSet.has(s[i]) {
				return false
			}
		}
	}
	return true
}

// IsCPUModel: ^[A-Za-z0-9][A-Za-z0-9_.+-]*$.
func IsCPUModel(s string) bool { return s != "" && alnumSet.has(s[0]) && serialSet.all(s) }

// IsMachineType: ^[a-z0-9][a-z0-9_.-]*$.
func IsMachineType(s string) bool {
	return s != "" && lowerDigitSet.has(s[0]) && machineTypeSet.all(s)
}

// IsCPUFeature: ^[a-z0-9][a-z0-9_.-]*$, at most 64 bytes: a -cpu property name, which cannot
// carry QemuOpts' "," or "=".
func IsCPUFeature(s string) bool { return len(s) <= 64 && IsMachineType(s) }

// IsTapName: ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}$, an interface name (IFNAMSIZ less the NUL).
func IsTapName(s string) bool {
	return s != "" && len(s) <= 15 && tapFirstSet.has(s[0]) && tapSet.all(s)
}

// IsMAC: ^([0-9A-Fa-f]{2}[:-]){5}[0-9A-Fa-f]{2}$ (each separator ':' or '-').
func IsMAC(s string) bool {
	if len(s) != 17 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if i%3 == 2 {
			if s[i] != ':' && s[i] != '-' {
				return false
			}
		} else if !hexSet.has(s[i]) {
			return false
		}
	}
	return true
}
