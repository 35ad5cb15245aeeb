package e2ecloud

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/test/testutil"
)

// BenchmarkCloudImageSSH measures create → SSH login for the cloud image, in the cluster and with
// bare QEMU in the same run, one after the other: cluster-s is from `kubectl apply` of the cloud
// sample VM (containerDisk, cloud-init NoCloud, masquerade) to the first successful SSH command at
// the launcher pod's address; bare-qemu-s is from starting qemu-system-x86_64 by hand with the same
// image under a qcow2 overlay, a NoCloud ISO with the same user data (written with the same ISO
// writer) and user-mode networking forwarding a port to 22, to the first successful SSH command
// there. The machine is the same as the launcher's (q35 under TCG, CPU model qemu64, one vCPU,
// 1 GiB, virtio disks with qvirt's default cache=none and aio=threads), so the difference is
// qvirt's: the pod, the image pull, the launcher, pod networking. cloudimage-ratio-vs-bare-qemu is
// cluster-s / bare-qemu-s (goal ≤ 1.2). Under emulation a boot takes one to three minutes and
// varies with the machine's load: -benchtime=3x alternates the order and averages.
//
// It also reports the image's figures (imageFigures.report): its size, and how long the build that
// made the cached image took.
func BenchmarkCloudImageSSH(b *testing.B) {
	image := cloudImageFigures(b)
	var cluster, bare time.Duration
	for i := range b.N {
		key, authorized := userKey(b)
		// Alternate the order, so a load that changes during the run weighs on both alike.
		if i%2 == 0 {
			bare += bareBoot(b, key, authorized)
			cluster += clusterBoot(b, fmt.Sprintf("bench-%d", i), key, authorized)
		} else {
			cluster += clusterBoot(b, fmt.Sprintf("bench-%d", i), key, authorized)
			bare += bareBoot(b, key, authorized)
		}
	}
	b.ReportMetric(cluster.Seconds()/float64(b.N), "cluster-s")
	b.ReportMetric(bare.Seconds()/float64(b.N), "bare-qemu-s")
	b.ReportMetric(float64(cluster)/float64(bare), "cloudimage-ratio-vs-bare-qemu")
	b.ReportMetric(0, "ns/op") // one boot is not a per-op cost
	image.report(b)
}

// imageFigures are the cloud image's: disk.qcow2's size and what test/guest/cloud/build.sh
// recorded in build-info when it built the cached image.
type imageFigures struct {
	qcow2Bytes int64
	info       map[string]string
	builtAt    time.Time
}

// cloudImageFigures reads them before the boots, so that a cache without build-info fails the
// benchmark before its minutes of boots rather than after.
func cloudImageFigures(b *testing.B) imageFigures {
	b.Helper()
	st, err := os.Stat(filepath.Join(cloudDir, "disk.qcow2"))
	if err != nil {
		b.Fatalf("cloud image: %v", err)
	}
	path := filepath.Join(cloudDir, "build-info")
	raw, err := os.ReadFile(path)
	if err != nil {
		b.Fatalf("cloud image build figures: %v (build.sh writes build-info when it builds; "+
			"QVIRT_CLOUD_FORCE=1 test/guest/cloud/build.sh rebuilds the cache)", err)
	}
	info := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok {
			info[k] = v
		}
	}
	for _, k := range []string{"seconds", "bootstrap", "rootfs-mib"} {
		if info[k] == "" {
			b.Fatalf("%s has no %q line:\n%s", path, k, raw)
		}
	}
	return imageFigures{qcow2Bytes: st.Size(), info: info, builtAt: st.ModTime()}
}

// report reports the image's figures. The build time is the one recorded when the cache was
// built, usually by an earlier run: cloud-build-cold-s when that build ran mmdebstrap (downloads
// included unless debs-cached says they were there), cloud-build-bootstrap-reused-s when it reused
// the bootstrapped tree, which is not a cold build.
func (f imageFigures) report(b *testing.B) {
	b.ReportMetric(float64(f.qcow2Bytes)/(1<<20), "cloud-qcow2-MiB")
	if mib, err := strconv.ParseFloat(f.info["rootfs-mib"], 64); err == nil {
		b.ReportMetric(mib, "cloud-rootfs-MiB")
	}
	secs, err := strconv.ParseFloat(f.info["seconds"], 64)
	if err != nil {
		b.Fatalf("build-info: seconds %q: %v", f.info["seconds"], err)
	}
	unit := "cloud-build-cold-s"
	if f.info["bootstrap"] != "ran" {
		unit = "cloud-build-bootstrap-reused-s"
	}
	b.ReportMetric(secs, unit)
	b.Logf("%s is the build that made the cached image (%s, %s .debs already downloaded), not this run's",
		unit, f.builtAt.UTC().Format(time.RFC3339), f.info["debs-cached"])
	if unit != "cloud-build-cold-s" {
		b.Logf("for a cold build's time, remove %s and run again", cloudDir)
	}
}

// benchSSH waits until SSH at addr lets the user in and runs a command; it returns when.
func benchSSH(b *testing.B, addr string, port int, key ssh.Signer, what string, tail func() string) time.Time {
	b.Helper()
	var lastErr error
	testutil.Eventually(b, bootTimeout, "SSH login to "+what, func() bool {
		_, _, lastErr = sshRunPort(addr, port, guestUser, key, "true")
		if lastErr != nil {
			time.Sleep(500 * time.Millisecond)
		}
		return lastErr == nil
	}, func() string { return fmt.Sprintf("last SSH error: %v\n%s", lastErr, tail()) })
	return time.Now()
}

// clusterBoot applies the cloud sample VM in a namespace of its own and returns the time to the
// first SSH login; the namespace is deleted afterwards.
func clusterBoot(b *testing.B, name string, key ssh.Signer, authorized string) time.Duration {
	b.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-"}}
	if err := cl.Create(ctx, ns); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cl.Delete(ctx, ns) }()
	vm := sample(b, "vm-cloud.yaml", ns.Name, name)
	volume(b, vm, "rootdisk").ContainerDisk.Image = cloudImage
	volume(b, vm, "cloudinitdisk").CloudInitNoCloud.UserData = userData(name, authorized)
	start := time.Now()
	apply(b, vm)
	vmi := waitVMI(b, ns.Name, name, bootTimeout, "Running", running(""))
	done := benchSSH(b, vmi.Status.Interfaces[0].IP, 22, key, "VM "+name, func() string { return "" })
	run(b, nil, kubectl, "delete", "vm", name, "-n", ns.Name, "--wait=false")
	waitVMI(b, ns.Name, name, 3*time.Minute, "gone", gone)
	return done.Sub(start)
}

// bareBoot boots the cloud image with qemu-system-x86_64 started by hand and returns the time from
// its start to the first SSH login.
func bareBoot(b *testing.B, key ssh.Signer, authorized string) time.Duration {
	b.Helper()
	dir := b.TempDir()
	overlay, seed := filepath.Join(dir, "overlay.qcow2"), filepath.Join(dir, "seed.iso")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-b", filepath.Join(cloudDir, "disk.qcow2"),
		"-F", "qcow2", overlay).CombinedOutput(); err != nil {
		b.Fatalf("qemu-img create: %v: %s", err, out)
	}
	const name = "bare"
	files := map[string][]byte{
		"user-data": []byte(userData(name, authorized)),
		"meta-data": []byte(`{"instance-id":"bare-1","local-hostname":"bare"}`),
	}
	if err := launcher.WriteISO(seed, "cidata", files, dir); err != nil {
		b.Fatal(err)
	}
	port := testutil.FreePort(b)
	var out testutil.SyncBuffer
	cmd := exec.Command("qemu-system-x86_64", "-machine", "q35,accel=tcg", "-cpu", "qemu64", "-smp", "1", "-m", "1024",
		"-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio",
		"-drive", "file="+overlay+",format=qcow2,if=virtio,cache=none,aio=threads",
		"-drive", "file="+seed+",format=raw,if=virtio,readonly=on,cache=none,aio=threads",
		"-netdev", fmt.Sprintf("user,id=n0,hostfwd=tcp:127.0.0.1:%d-:22", port), "-device", "virtio-net-pci,netdev=n0")
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	done := benchSSH(b, "127.0.0.1", port, key, "bare QEMU", func() string {
		return "bare QEMU's serial console:\n" + testutil.Tail(strings.ReplaceAll(out.String(), "\r", ""), 3000)
	})
	return done.Sub(start)
}
