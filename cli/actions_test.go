package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	qv1 "github.com/qvirt/qvirt/api/v1alpha1"
)

// The namespace resolves as kubectl's: the current context's, --context's, -n, and KUBECONFIG
// stands in for --kubeconfig; the credentials reach the server.
func TestKubeconfigContextAndNamespace(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	cases := []struct {
		args []string
		env  bool
		want string
	}{
		{args: []string{"--kubeconfig", kc}, want: "/namespaces/ns-a/"},
		{args: []string{"--kubeconfig", kc, "--context", "b"}, want: "/namespaces/ns-b/"},
		{args: []string{"--kubeconfig", kc, "--context", "b", "-n", "other"}, want: "/namespaces/other/"},
		{args: []string{"--namespace=third"}, env: true, want: "/namespaces/third/"},
		{env: true, want: "/namespaces/ns-a/"},
	}
	for _, tc := range cases {
		if tc.env {
			t.Setenv("KUBECONFIG", kc)
		}
		before := len(f.recorded())
		out, errOut, code := run(t, nil, append([]string{"start", "vm1"}, tc.args...)...)
		if code != 0 {
			t.Fatalf("start %v: exit %d, stderr %q", tc.args, code, errOut)
		}
		if out != "VM vm1 was scheduled to start\n" {
			t.Errorf("start %v printed %q", tc.args, out)
		}
		reqs := f.recorded()[before:]
		if len(reqs) != 1 || !strings.HasPrefix(reqs[0], "PUT /apis/subresources.qvirt.io/v1alpha1"+tc.want+"virtualmachines/vm1/start") {
			t.Errorf("start %v sent %q, want a PUT under %s", tc.args, reqs, tc.want)
		}
	}
}

func TestActionsSendTheContractsBodies(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"stop", "vm1", "--grace-period", "0", "--force"}, `PUT /apis/subresources.qvirt.io/v1alpha1/namespaces/ns-a/virtualmachines/vm1/stop {"gracePeriodSeconds":0,"force":true}`},
		{[]string{"stop", "vm1", "--grace-period", "5"}, `PUT /apis/subresources.qvirt.io/v1alpha1/namespaces/ns-a/virtualmachines/vm1/stop {"gracePeriodSeconds":5}`},
		{[]string{"stop", "vm1"}, `PUT /apis/subresources.qvirt.io/v1alpha1/namespaces/ns-a/virtualmachines/vm1/stop {}`},
		{[]string{"start", "vm1", "--paused"}, `PUT /apis/subresources.qvirt.io/v1alpha1/namespaces/ns-a/virtualmachines/vm1/start {"paused":true}`},
		{[]string{"restart", "vm1", "--grace-period", "0"}, `PUT /apis/subresources.qvirt.io/v1alpha1/namespaces/ns-a/virtualmachines/vm1/restart {"gracePeriodSeconds":0}`},
		{[]string{"restart", "vm1", "--force"}, `PUT /apis/subresources.qvirt.io/v1alpha1/namespaces/ns-a/virtualmachines/vm1/restart {"force":true}`},
		{[]string{"pause", "vmi", "vm1"}, `PUT /apis/subresources.qvirt.io/v1alpha1/namespaces/ns-a/virtualmachineinstances/vm1/pause`},
		{[]string{"unpause", "vmi", "vm1"}, `PUT /apis/subresources.qvirt.io/v1alpha1/namespaces/ns-a/virtualmachineinstances/vm1/unpause`},
		{[]string{"softreboot", "vm1"}, `PUT /apis/subresources.qvirt.io/v1alpha1/namespaces/ns-a/virtualmachineinstances/vm1/softreboot`},
		{[]string{"removevolume", "vm1", "--volume-name", "data"}, `PUT /apis/subresources.qvirt.io/v1alpha1/namespaces/ns-a/virtualmachines/vm1/removevolume {"name":"data"}`},
		{[]string{"addvolume", "vm1", "--volume-name", "data", "--empty-disk", "1Gi", "--serial", "D1"},
			`PUT /apis/subresources.qvirt.io/v1alpha1/namespaces/ns-a/virtualmachines/vm1/addvolume {"name":"data","disk":{"name":"data","disk":{"bus":"virtio"},"serial":"D1"},"volumeSource":{"emptyDisk":{"capacity":"1Gi"}}}`},
		{[]string{"addvolume", "vm1", "--volume-name", "hd", "--host-disk", "/var/lib/qvirt/hd.img", "--host-disk-type", "DiskOrCreate", "--capacity", "512Mi"},
			`PUT /apis/subresources.qvirt.io/v1alpha1/namespaces/ns-a/virtualmachines/vm1/addvolume {"name":"hd","disk":{"name":"hd","disk":{"bus":"virtio"}},"volumeSource":{"hostDisk":{"path":"/var/lib/qvirt/hd.img","type":"DiskOrCreate","capacity":"512Mi"}}}`},
	}
	for _, tc := range cases {
		before := len(f.recorded())
		_, errOut, code := run(t, nil, append(tc.args, "--kubeconfig", kc)...)
		if code != 0 {
			t.Fatalf("%v: exit %d, stderr %q", tc.args, code, errOut)
		}
		reqs := f.recorded()[before:]
		if len(reqs) != 1 || strings.TrimSpace(reqs[0]) != tc.want {
			t.Errorf("%v sent\n %q\nwant\n %q", tc.args, reqs, tc.want)
		}
	}
}

func TestBadInputIsRefusedBeforeAnythingIsSent(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"addvolume", "vm1", "--volume-name", "d", "--empty-disk", "lots"}, `error: --empty-disk: "lots" is not a size`},
		{[]string{"addvolume", "vm1", "--volume-name", "d", "--empty-disk", "-1Gi"}, "more than 0 bytes"},
		{[]string{"addvolume", "vm1", "--volume-name", "d"}, "exactly one of --host-disk PATH and --empty-disk SIZE"},
		{[]string{"addvolume", "vm1", "--volume-name", "d", "--host-disk", "rel.img"}, "--host-disk \"rel.img\": want an absolute path"},
		{[]string{"addvolume", "vm1", "--empty-disk", "1Gi"}, "--volume-name is required"},
		{[]string{"stop", "vm1", "--grace-period", "-3"}, "--grace-period -3"},
		{[]string{"stop", "vm1", "--grace-period", "30", "--force"}, "--force and --grace-period 30 cannot be used together"},
		{[]string{"restart", "vm1", "--grace-period", "5", "--force"}, "--force and --grace-period 5 cannot be used together"},
		{[]string{"pause", "vmx", "vm1"}, `first argument "vmx": want vm or vmi`},
		{[]string{"qmp", "vm1", "--", "query-status", "{bad"}, `JSON-ARGS of query-status: "{bad" is not a JSON object`},
		{[]string{"qmp", "vm1", "--", "query-status", "[1]"}, `JSON-ARGS of query-status: "[1]" is not a JSON object`},
		{[]string{"qmp", "vm1", "--", "bad command"}, `QMP command "bad command"`},
		{[]string{"vnc", "screenshot", "vm1"}, "-o/--output FILE.png is required"},
	}
	for _, tc := range cases {
		before := len(f.recorded())
		_, errOut, code := run(t, nil, append([]string{"--kubeconfig", kc}, tc.args...)...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want an error containing %q", tc.args, code, errOut, tc.want)
		}
		if reqs := f.recorded()[before:]; len(reqs) != 0 {
			t.Errorf("%v sent %q before failing", tc.args, reqs)
		}
	}
}

// Server errors read like kubectl's and say what to do.
func TestServerErrorsReadLikeKubectl(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	_, errOut, code := run(t, nil, "start", "missing-vm", "--kubeconfig", kc)
	if code != 1 || errOut != "Error from server (NotFound): virtualmachines \"missing-vm\" not found\n"+
		"Check the name and the namespace (-n); list them with: kubectl get vm -n ns-a\n" {
		t.Errorf("unknown VM: exit %d, stderr %q", code, errOut)
	}
	// pause vm checks the VirtualMachine in the real kube-apiserver first.
	before := len(f.recorded())
	_, errOut, code = run(t, nil, "pause", "vm", "nosuchvm", "--kubeconfig", kc)
	if code != 1 || !strings.Contains(errOut, `Error from server (NotFound): virtualmachines.qvirt.io "nosuchvm" not found`) ||
		!strings.Contains(errOut, "kubectl get vm -n ns-a") {
		t.Errorf("pause vm of a missing VM: exit %d, stderr %q", code, errOut)
	}
	if reqs := f.recorded()[before:]; len(reqs) != 0 {
		t.Errorf("pause of a missing VM sent %q", reqs)
	}
	// A wrong token: kubectl's Unauthorized, with advice.
	bad := strings.Replace(readFile(t, kc), testToken, "wrong", 1)
	badPath := writeTemp(t, bad)
	_, errOut, code = run(t, nil, "start", "vm1", "--kubeconfig", badPath)
	if code != 1 || !strings.Contains(errOut, "Error from server (Unauthorized)") || !strings.Contains(errOut, "credentials were refused") {
		t.Errorf("bad token: exit %d, stderr %q", code, errOut)
	}
	// An unknown context is the kubeconfig's error, as kubectl reports it.
	_, errOut, code = run(t, nil, "start", "vm1", "--kubeconfig", kc, "--context", "nope")
	if code != 1 || !strings.Contains(errOut, `context "nope" does not exist`) {
		t.Errorf("unknown context: exit %d, stderr %q", code, errOut)
	}
}

func TestPauseVMPausesItsInstance(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	ensureNamespace(t, "ns-a")
	vm := &qv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns-a", Name: "pausevm"}}
	halted := qv1.RunStrategyHalted
	vm.Spec.RunStrategy = &halted
	mem := resource.MustParse("128Mi")
	vm.Spec.Template.Spec.Domain.Memory = &qv1.Memory{Guest: &mem}
	if err := cp.Client.Create(context.Background(), vm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), vm) })
	out, errOut, code := run(t, nil, "pause", "vm", "pausevm", "--kubeconfig", kc)
	if code != 0 || out != "VMI pausevm was paused\n" {
		t.Fatalf("pause vm: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	reqs := f.recorded()
	if last := reqs[len(reqs)-1]; !strings.Contains(last, "/virtualmachineinstances/pausevm/pause") {
		t.Errorf("pause vm sent %q", last)
	}
}

func TestVersionPrintsClientEvenWhenTheServerFails(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	out, errOut, code := run(t, nil, "version", "--kubeconfig", kc)
	if code != 0 || !strings.Contains(out, "Client Version: ") || !strings.Contains(out, "Server Version: v0.1.0-fake (go1.26.8, linux/amd64)") {
		t.Errorf("version: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	f.srv.Close()
	out, errOut, code = run(t, nil, "version", "--kubeconfig", kc)
	if code != 1 || !strings.HasPrefix(out, "Client Version: ") || errOut == "" {
		t.Errorf("version against a dead server: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestPluginNameInUsage(t *testing.T) {
	if got := DisplayName("/usr/local/bin/kubectl-qvirt"); got != "kubectl qvirt" {
		t.Errorf("DisplayName(kubectl-qvirt) = %q", got)
	}
	if got := DisplayName("./bin/qvirtctl"); got != "qvirtctl" {
		t.Errorf("DisplayName(qvirtctl) = %q", got)
	}
	var out, errOut bytes.Buffer
	code := Main([]string{"/x/kubectl-qvirt", "console", "--help"}, strings.NewReader(""), &out, &errOut)
	if code != 0 || !strings.Contains(out.String(), "kubectl qvirt console VMI") {
		t.Errorf("plugin help: exit %d, %q", code, out.String())
	}
	out.Reset()
	code = Main([]string{"qvirtctl", "completion", "bash"}, strings.NewReader(""), &out, &errOut)
	if code != 0 || !strings.Contains(out.String(), "__start_qvirtctl") {
		t.Errorf("completion bash: exit %d, %d bytes", code, out.Len())
	}
}

// TestGuestOSInfoPrintsTheAgentsReport: qvirtctl guestosinfo GETs its subresource and prints the
// JSON indented; a VMI without an agent gets qvirt-api's refusal.
func TestGuestOSInfoPrintsTheAgentsReport(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	out, errOut, code := run(t, nil, "guestosinfo", "vm1", "--kubeconfig", kc)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want := "{\n  \"guestAgentVersion\": \"7.2.22\",\n  \"hostname\": \"vm1\",\n  \"os\": {\n    \"id\": \"debian\",\n    \"prettyName\": \"Debian GNU/Linux 12\"\n  }\n}\n"
	if out != want {
		t.Errorf("printed\n%s\nwant\n%s", out, want)
	}
	if reqs := f.recorded(); reqs[len(reqs)-1] != "GET /apis/subresources.qvirt.io/v1alpha1/namespaces/ns-a/virtualmachineinstances/vm1/guestosinfo " {
		t.Errorf("sent %q", reqs[len(reqs)-1])
	}
	_, errOut, code = run(t, nil, "guestosinfo", "noagent", "--kubeconfig", kc)
	if code == 0 || !strings.Contains(errOut, "the guest agent is not connected") {
		t.Errorf("without an agent: exit %d, stderr %q", code, errOut)
	}
}
