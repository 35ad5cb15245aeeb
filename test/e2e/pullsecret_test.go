package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	ggcr "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/local/registry"
	"github.com/qvirt/qvirt/test/testutil"
)

// The private registry's only account.
const privateUser, privatePassword = "tenant", "e2e-s3cret"

// startPrivateRegistry serves a registry that answers nothing, pulls and pushes alike, without
// privateUser's credentials (401 with a Basic challenge, as a private registry does). It listens on
// loopback: the virtual nodes pull in the host's network namespace, as a kubelet does.
func startPrivateRegistry() (addr string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("private registry: %w", err)
	}
	inner := ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0)))
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != privateUser || p != privatePassword {
			w.Header().Set("WWW-Authenticate", `Basic realm="qvirt-e2e"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
			return
		}
		inner.ServeHTTP(w, r)
	})}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "e2e: private registry:", err)
		}
	}()
	return ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// pushPrivate pushes a 1 MiB containerDisk starting with marker to the private registry, with its
// credentials.
func pushPrivate(t *testing.T, ref, marker string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(f, append([]byte(marker), make([]byte, 1<<20-len(marker))...), 0o644); err != nil {
		t.Fatal(err)
	}
	auth := remote.WithAuth(&authn.Basic{Username: privateUser, Password: privatePassword})
	if err := registry.PushContainerDisk(ctx, ref, f, "/disk/disk.img", auth); err != nil {
		t.Fatal(err)
	}
}

// TestPrivateContainerDisk: a VM whose containerDisk is in a registry that serves only with
// credentials, named by the volume's imagePullSecret (a docker-registry Secret made with kubectl),
// runs, and its guest reads the private image's bytes. The same kind of VM without the Secret, or
// with a Secret whose password is wrong, shows ErrImagePull or ImagePullBackOff as its STATUS, and
// its instance's Synchronized condition names spec.volumes[root].containerDisk.image and the image,
// while the node retries. The credentials reach only the pod's imagePullSecrets, which the node
// resolves as a kubelet does (qvirt-handler cannot read Secrets: test/manifests).
func TestPrivateContainerDisk(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	repo := privateRegistry + "/tenant/e2e-" + ns
	// Each VM its own image: a node that pulled one with credentials would serve it from its cache
	// to an IfNotPresent pull.
	images := map[string]string{"private": repo + "-disk:1", "nosecret": repo + "-nosecret:1", "wrongsecret": repo + "-wrong:1"}
	for name, ref := range images {
		pushPrivate(t, ref, "QVIRT-PRIVATE-"+strings.ToUpper(name))
	}
	for name, password := range map[string]string{"regcred": privatePassword, "badcred": "not-the-password"} {
		run(t, nil, kubectl, "create", "secret", "docker-registry", name, "-n", ns, "--docker-server="+privateRegistry,
			"--docker-username="+privateUser, "--docker-password="+password)
	}
	withDisk := func(name, secret string) *v1alpha1.VirtualMachine {
		vm := demoVM(t, ns, name, v1alpha1.RunStrategyAlways)
		spec := &vm.Spec.Template.Spec
		spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, v1alpha1.Disk{Name: "root",
			Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}})
		spec.Volumes = append(spec.Volumes, v1alpha1.Volume{Name: "root", VolumeSource: v1alpha1.VolumeSource{
			ContainerDisk: &v1alpha1.ContainerDiskSource{Image: images[name], ImagePullSecret: secret}}})
		return vm
	}
	applyVM(t, withDisk("private", "regcred"))
	applyVM(t, withDisk("nosecret", ""))
	applyVM(t, withDisk("wrongsecret", "badcred"))

	vmi := waitVMI(t, ns, "private", bootTimeout, "Running", running(""))
	c := console(t, vmi)
	at := c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	c.Send(t, "head -c 22 /dev/vda; echo; echo READ-$((1+1))")
	end := c.Expect(t, at, "READ-2", time.Minute)
	if got := c.Text()[at:end]; !strings.Contains(got, "QVIRT-PRIVATE-PRIVATE") {
		t.Errorf("the guest reads %q from its containerDisk, want QVIRT-PRIVATE-PRIVATE", got)
	}

	for _, name := range []string{"nosecret", "wrongsecret"} {
		t.Run(name, func(t *testing.T) { refusedPull(t, ns, name, images[name]) })
	}
}

// refusedPull waits for VM name to show that its image cannot be pulled: ErrImagePull or
// ImagePullBackOff in its STATUS, and a Synchronized condition naming the field and the image.
func refusedPull(t *testing.T, ns, name, image string) {
	t.Helper()
	testutil.Eventually(t, 2*time.Minute, "VM "+name+" to show ErrImagePull or ImagePullBackOff", func() bool {
		st := strings.TrimSpace(run(t, nil, kubectl, "get", "vm", name, "-n", ns, "--no-headers", "-o", "custom-columns=STATUS:.status.printableStatus"))
		return st == "ErrImagePull" || st == "ImagePullBackOff"
	}, func() string { return run(t, nil, kubectl, "get", "vm", name, "-n", ns, "-o", "yaml") })
	v := waitVMI(t, ns, name, time.Minute, "a Synchronized condition naming the containerDisk's image", func(v *v1alpha1.VirtualMachineInstance) bool {
		c := syncCondition(v)
		return c != nil && strings.Contains(c.Message, "spec.volumes[root].containerDisk.image") && strings.Contains(c.Message, image)
	})
	c := syncCondition(v)
	t.Logf("VMI %s: %s: %s", name, c.Reason, c.Message)
	if !strings.Contains(strings.ToLower(c.Message), "unauthorized") {
		t.Errorf("VMI %s's condition does not say the registry refused the credentials: %s", name, c.Message)
	}
	if v.Status.Phase.Final() || v.Status.Phase == v1alpha1.Running {
		t.Errorf("VMI %s is %s, want it waiting for its image", name, v.Status.Phase)
	}
}
