package machine

import (
	"math/rand/v2"
	"regexp"
	"testing"
)

// TestShapesMatchTheirExpressions holds each shape check against the regular expression it
// replaces, on hand-picked edge cases and on random strings over the bytes that matter.
func TestShapesMatchTheirExpressions(t *testing.T) {
	shapes := []struct {
		name string
		re   *regexp.Regexp
		fn   func(string) bool
	}{
		{"serial", regexp.MustCompile(`^[A-Za-z0-9_.+-]+$`), IsSerial},
		{"uuid", regexp.MustCompile(`^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$`), IsUUID},
		{"label", regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`), IsLabel},
		{"subdomain", regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`), IsSubdomain},
		{"cpu model", regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.+-]*$`), IsCPUModel},
		{"machine type", regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]*$`), IsMachineType},
		{"tap", regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}$`), IsTapName},
		{"mac", regexp.MustCompile(`^([0-9A-Fa-f]{2}[:-]){5}[0-9A-Fa-f]{2}$`), IsMAC},
	}
	fixed := []string{"", "a", "-", ".", "a-", "-a", "a.b", "a..b", ".a", "a.", "A", "_", "+", "a\n", "\na",
		"é", "a\x00", "q35", "pc-q35-7.2", "host", "Skylake-Server-v4", "qvtap0", "0123456789abcde", "0123456789abcdef",
		"02:00:00:00:00:01", "02-00-00-00-00-01", "02:00-00:00-00:01", "02:00:00:00:00:0g", "02:00:00:00:00:011",
		"6a1c6d35-6a0e-4b9b-9d3a-0123456789ab", "6A1C6D35-6A0E-4B9B-9D3A-0123456789AB", "6a1c6d35-6a0e-4b9b-9d3a-0123456789a",
		"6a1c6d35x6a0e-4b9b-9d3a-0123456789ab", "testguest", "my-vm.example.com"}
	const alphabet = "az09AZfFgG-_.+:\n\x00\xff"
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		b := make([]byte, rng.IntN(40))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		fixed = append(fixed, string(b))
	}
	// Random strings of the exact shapes' lengths, so the fixed-length ones are exercised too.
	for range 200000 {
		n := []int{17, 36}[rng.IntN(2)]
		b := make([]byte, n)
		for i := range b {
			b[i] = "09afAF-:g"[rng.IntN(9)]
		}
		fixed = append(fixed, string(b))
	}
	for _, s := range shapes {
		for _, in := range fixed {
			if want, got := s.re.MatchString(in), s.fn(in); want != got {
				t.Errorf("%s(%q) = %v, the expression says %v", s.name, in, got, want)
			}
		}
	}
}
