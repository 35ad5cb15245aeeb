package restlimit

import (
	"flag"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

func TestApply(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		qps   float32
		burst int
		err   string
	}{
		{nil, 200, 400, ""},
		{[]string{"--kube-api-qps=50", "--kube-api-burst=50"}, 50, 50, ""},
		{[]string{"--kube-api-qps=0"}, 0, 0, "--kube-api-qps 0: want a number above 0"},
		{[]string{"--kube-api-qps=-1"}, 0, 0, "--kube-api-qps -1"},
		{[]string{"--kube-api-burst=0"}, 0, 0, "--kube-api-burst 0: want at least 1"},
		{[]string{"--kube-api-qps=500"}, 0, 0, "--kube-api-burst 400: want at least 1 and at least --kube-api-qps (500)"},
	} {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		f := Register(fs, 200, 400)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		cfg := &rest.Config{}
		err := f.Apply(cfg)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%v: error %v, want one saying %q", tc.args, err, tc.err)
		case tc.err == "" && (cfg.QPS != tc.qps || cfg.Burst != tc.burst):
			t.Errorf("%v: QPS %v burst %d, want %v %d", tc.args, cfg.QPS, cfg.Burst, tc.qps, tc.burst)
		}
	}
}
