package e2ecloud

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/test/envtest"
	"github.com/qvirt/qvirt/test/testutil"
)

// bootTimeout bounds a cloud guest's way from VM creation to sshd answering under emulation, with
// other guests booting beside it on two cores: one boot alone takes 1.5-3 minutes.
const bootTimeout = 12 * time.Minute

// namespace makes a namespace for one test and deletes it (and whatever is left in it) at the end.
func namespace(t *testing.T) string { return ec.Namespace(t, "cloud-") }

// run runs a command against the cluster and returns its stdout, failing the test with its stderr.
func run(t testing.TB, stdin []byte, name string, args ...string) string {
	t.Helper()
	return ec.Run(t, stdin, name, args...)
}

// qvirtctl runs qvirtctl against the cluster and fails the test unless it succeeds.
func qvirtctl(t testing.TB, args ...string) string {
	t.Helper()
	return run(t, nil, filepath.Join(bin, "qvirtctl"), args...)
}

// apply creates or updates objects with `kubectl apply`, as a user would.
func apply(t testing.TB, objs ...client.Object) {
	t.Helper()
	var docs [][]byte
	for _, o := range objs {
		if vm, ok := o.(*v1alpha1.VirtualMachine); ok {
			vm.APIVersion, vm.Kind = v1alpha1.GroupVersion.String(), "VirtualMachine"
		}
		data, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, data)
	}
	run(t, bytes.Join(docs, []byte("---\n")), kubectl, "apply", "-f", "-")
}

// sample is a VM manifest of config/samples, renamed into ns.
func sample(t testing.TB, file, ns, name string) *v1alpha1.VirtualMachine {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(envtest.RepoRoot(), "config", "samples", file))
	if err != nil {
		t.Fatal(err)
	}
	vm := &v1alpha1.VirtualMachine{}
	if err := yaml.UnmarshalStrict(data, vm); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	vm.Namespace, vm.Name = ns, name
	return vm
}

// volume is the VM's volume called name.
func volume(t testing.TB, vm *v1alpha1.VirtualMachine, name string) *v1alpha1.Volume {
	t.Helper()
	for i := range vm.Spec.Template.Spec.Volumes {
		if v := &vm.Spec.Template.Spec.Volumes[i]; v.Name == name {
			return v
		}
	}
	t.Fatalf("VM %s has no volume %s", vm.Name, name)
	return nil
}

// disk is the VM's disk called name.
func disk(t testing.TB, vm *v1alpha1.VirtualMachine, name string) *v1alpha1.Disk {
	t.Helper()
	for i := range vm.Spec.Template.Spec.Domain.Devices.Disks {
		if d := &vm.Spec.Template.Spec.Domain.Devices.Disks[i]; d.Name == name {
			return d
		}
	}
	t.Fatalf("VM %s has no disk %s", vm.Name, name)
	return nil
}

func getVMI(ns, name string) (*v1alpha1.VirtualMachineInstance, error) {
	var vmi v1alpha1.VirtualMachineInstance
	err := cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &vmi)
	return &vmi, err
}

// waitVMI waits until the VMI ns/name satisfies ok and returns it; on a timeout the message
// holds its status and the details.
func waitVMI(t testing.TB, ns, name string, d time.Duration, what string, ok func(*v1alpha1.VirtualMachineInstance) bool, details ...func() string) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	var got *v1alpha1.VirtualMachineInstance
	testutil.Eventually(t, d, fmt.Sprintf("VMI %s/%s %s", ns, name, what), func() bool {
		v, err := getVMI(ns, name)
		if err != nil {
			v = nil
		}
		got = v
		return ok(v)
	}, append([]func() string{func() string {
		if got == nil {
			return "no VMI"
		}
		return fmt.Sprintf("VMI %s phase %s node %s conditions %+v", got.UID, got.Status.Phase, got.Status.NodeName, got.Status.Conditions)
	}}, details...)...)
	return got
}

// running is a VMI that runs with its pod address known, other than the one with UID not.
func running(not types.UID) func(*v1alpha1.VirtualMachineInstance) bool {
	return func(v *v1alpha1.VirtualMachineInstance) bool {
		return v != nil && v.UID != not && v.DeletionTimestamp == nil && v.Status.Phase == v1alpha1.Running &&
			len(v.Status.Interfaces) > 0 && v.Status.Interfaces[0].IP != ""
	}
}

func gone(v *v1alpha1.VirtualMachineInstance) bool { return v == nil }

// podIP is the address of the VMI's active launcher pod.
func podIP(t testing.TB, vmi *v1alpha1.VirtualMachineInstance) string {
	t.Helper()
	for _, p := range ec.LauncherPods(t, vmi) {
		if _, active := vmi.Status.ActivePods[p.UID]; active && p.Status.PodIP != "" {
			return p.Status.PodIP
		}
	}
	t.Fatalf("VMI %s has no active launcher pod with an address", vmi.Name)
	return ""
}

// userKey is a fresh SSH key pair: the signer the test logs in with and the public key in
// authorized_keys form.
func userKey(t testing.TB) (ssh.Signer, string) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return signer, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))
}

// sshRun logs in to addr:22 as user with key, runs cmd and returns its output and the server's
// host key.
func sshRun(addr, user string, key ssh.Signer, cmd string) (string, ssh.PublicKey, error) {
	return sshRunPort(addr, 22, user, key, cmd)
}

// sshRunPort is sshRun at addr:port. Every step is bounded: a guest that is still booting may
// accept and stall.
func sshRunPort(addr string, port int, user string, key ssh.Signer, cmd string) (string, ssh.PublicKey, error) {
	var hostKey ssh.PublicKey
	cfg := &ssh.ClientConfig{
		User: user,
		Auth: []ssh.AuthMethod{ssh.PublicKeys(key)},
		HostKeyCallback: func(_ string, _ net.Addr, k ssh.PublicKey) error {
			hostKey = k // compared across boots by the caller
			return nil
		},
		Timeout: 15 * time.Second,
	}
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(addr, strconv.Itoa(port)), 5*time.Second)
	if err != nil {
		return "", nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Minute))
	c, chans, reqs, err := ssh.NewClientConn(conn, addr, cfg)
	if err != nil {
		return "", hostKey, err
	}
	sc := ssh.NewClient(c, chans, reqs)
	defer sc.Close()
	s, err := sc.NewSession()
	if err != nil {
		return "", hostKey, err
	}
	defer s.Close()
	out, err := s.CombinedOutput(cmd)
	if err != nil {
		return string(out), hostKey, fmt.Errorf("ssh %s@%s %q: %w: %s", user, addr, cmd, err, out)
	}
	return string(out), hostKey, nil
}

// userConsole is `qvirtctl console NAME` on a pseudo-terminal: what a user sees and types.
type userConsole struct {
	term *testutil.PTYCommand
}

// openConsole starts `qvirtctl console` for the VM's instance; it waits for an instance that is
// still starting, so it shows the whole boot. It is closed when the test ends.
func openConsole(t testing.TB, ns, name string) *userConsole {
	t.Helper()
	cmd := exec.Command(filepath.Join(bin, "qvirtctl"), "console", name, "-n", ns, "--timeout", "5m")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+lc.Kubeconfig)
	c := &userConsole{term: testutil.StartOnPTY(t, cmd)}
	t.Cleanup(c.close)
	return c
}

// close leaves the console as a user does (Ctrl+]); safe to call more than once. A console that
// does not leave within 5 s is killed.
func (c *userConsole) close() { _ = c.term.Detach(5 * time.Second) }

// text is what the console showed, carriage returns dropped.
func (c *userConsole) text() string { return strings.ReplaceAll(c.term.Screen.String(), "\r", "") }

// tail is the end of what the console showed, for failure messages.
func (c *userConsole) tail() string {
	return "serial console (qvirtctl console), last 3000 bytes:\n" + testutil.Tail(c.text(), 3000)
}

// expect waits until the console shows want after offset from and returns the end of the match.
func (c *userConsole) expect(t testing.TB, from int, want string, d time.Duration) int {
	t.Helper()
	end := 0
	testutil.Eventually(t, d, fmt.Sprintf("%q on the serial console", want), func() bool {
		text := c.text()
		if from > len(text) {
			return false
		}
		i := strings.Index(text[from:], want)
		end = from + i + len(want)
		return i >= 0
	}, c.tail)
	return end
}

// typeLine types s and Enter.
func (c *userConsole) typeLine(t testing.TB, s string) {
	t.Helper()
	c.term.Type(t, s+"\r")
}
