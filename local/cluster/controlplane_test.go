package cluster

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/qvirt/qvirt/local/supervise"
	"github.com/qvirt/qvirt/test/envtest"
	"github.com/qvirt/qvirt/test/podnet"
)

// freePort is a TCP port nobody listens on now (and port+1 for etcd's peer URL).
func freePort(t *testing.T) int {
	t.Helper()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if l2, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", itoa(port+1))); err == nil {
			l2.Close()
			return port
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestControlPlane brings up the real control plane under the supervisor, as `local up` does: the
// API server answers with the admin kubeconfig at the bridge address, a killed component comes
// back, and Stop leaves no process.
func TestControlPlane(t *testing.T) {
	tools, err := envtest.Assets()
	if err != nil {
		t.Fatal(err)
	}
	pods := podnet.NewNetwork(t)
	dir := t.TempDir()
	sup, err := supervise.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			sup.Stop(10 * time.Second)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	started := time.Now()
	cp, err := StartControlPlane(ctx, sup, ControlPlaneOptions{Dir: dir, Tools: tools,
		Address: pods.Gateway.AsSlice(), APIServerPort: freePort(t), EtcdPort: freePort(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("control plane ready in %.1fs", time.Since(started).Seconds())

	cfg, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("the admin kubeconfig at %s does not work: %v", cp.Server, err)
	}

	if err := sup.Kill("kube-scheduler"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		states, _ := supervise.ReadStates(dir)
		var sched supervise.State
		for _, st := range states {
			if st.Name == "kube-scheduler" {
				sched = st
			}
		}
		if sched.State == supervise.Running && sched.Restarts == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-scheduler not restarted: %+v", states)
		}
		time.Sleep(100 * time.Millisecond)
	}

	states, _ := supervise.ReadStates(dir)
	sup.Stop(10 * time.Second)
	stopped = true
	for _, st := range states {
		if st.PID != 0 && supervise.Alive(st.PID, st.Path) {
			t.Errorf("%s (pid %d) still runs after Stop", st.Name, st.PID)
		}
	}
}
