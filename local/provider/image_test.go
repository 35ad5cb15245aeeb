package provider_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/crane"
	"github.com/google/go-containerregistry/pkg/name"
	ggcr "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/local/provider"
	"github.com/qvirt/qvirt/test/testutil"
)

// A registry that answers only a client holding the tenant's credentials, as a private registry
// does: the provider must pull with the pod's imagePullSecrets.
func privateRegistry(t *testing.T, user, password string) string {
	t.Helper()
	inner := ggcr.New()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != password {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// pushDisk pushes an image holding /disk/data.img with content, with the registry's credentials.
func pushDisk(t *testing.T, ref, user, password, content string) string {
	t.Helper()
	img, err := crane.Image(map[string][]byte{"disk/data.img": []byte(content)})
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	auth := remote.WithAuth(&authn.Basic{Username: user, Password: password})
	if err := remote.Write(r, img, auth); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func ownerUID(st os.FileInfo) uint32 { return st.Sys().(*syscall.Stat_t).Uid }

// imagePod mounts ref read-only at /img and reports through its termination message what it read
// from the image and whether it could write to it.
func imagePod(name, ref, secret string) *corev1.Pod {
	script := `cat /img/disk/data.img > /dev/termination-log
(echo x >> /img/disk/data.img) 2>/dev/null && echo " WROTE-FILE" >> /dev/termination-log
(echo x > /img/new) 2>/dev/null && echo " WROTE-DIR" >> /dev/termination-log
exit 0`
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:    corev1.RestartPolicyNever,
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: secret}},
			SecurityContext:  &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](107), RunAsGroup: ptr.To[int64](107)},
			Containers: []corev1.Container{{
				Name: "reader", Image: busyboxImage, Command: []string{"sh", "-c", script},
				VolumeMounts: []corev1.VolumeMount{{Name: "disk", MountPath: "/img", ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{{Name: "disk", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{
				Reference: ref, PullPolicy: corev1.PullIfNotPresent}}}},
		},
	}
}

// Virtual nodes implement image volumes as a kubelet does: the provider pulls with the pod's
// imagePullSecrets into a root-owned cache, binds the image read-only and reports its digest; a
// cache file changed after unpacking never reaches a pod.
func TestImageVolumes(t *testing.T) {
	testutil.LockHostNetwork(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	binDir, err := provider.BuildCNIPlugins(ctx, filepath.Join(cacheHome(t), "qvirt", "cni"))
	if err != nil {
		t.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(cp.Config)
	ns, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "vnode-img-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	addr := privateRegistry(t, "tenant", "s3cret")
	liar := lyingRegistry(t)
	ref := addr + "/tenant/disk:1"
	digest := pushDisk(t, ref, "tenant", "s3cret", "original")
	dockerCfg, _ := json.Marshal(map[string]any{"auths": map[string]any{addr: map[string]string{
		"auth": base64.StdEncoding.EncodeToString([]byte("tenant:s3cret"))}}})
	if _, err := client.CoreV1().Secrets(ns.Name).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "creds"}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: dockerCfg},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	log, dumpLog := fileLogger(t)
	defer dumpLog()
	cache := filepath.Join(t.TempDir(), "images")
	n := startNode(t, ctx, "vnode-img", "10.231.9.0/24", "qvt-test-img", binDir, log, func(o *provider.Options) {
		o.ImageCache = cache
		o.InsecureRegistries = []string{addr, liar}
		o.ImagePullBackoff = time.Second
	})
	defer n.stop(t)
	tc := &testCluster{t: t, ctx: ctx, client: client, ns: ns.Name}
	tc.waitNode(n.name)

	run := func(t *testing.T, name string) *corev1.Pod {
		tc.t = t
		pod := imagePod(name, ref, "creds")
		pod.Spec.NodeName = n.name
		tc.create(pod)
		return tc.waitFor(name, "finished or failing to pull", func(p *corev1.Pod) bool {
			return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || waitingReason(p) == "ErrImagePull"
		})
	}

	t.Run("the image's files are there, read-only, and the status carries the digest", func(t *testing.T) {
		pod := run(t, "first")
		cs := pod.Status.ContainerStatuses[0]
		if term := cs.State.Terminated; term == nil || term.Message != "original" {
			t.Fatalf("container ended %+v, want it to read %q and write nothing", cs.State, "original")
		}
		var imageRef string
		for _, m := range cs.VolumeMounts {
			if m.Name == "disk" && m.VolumeStatus != nil && m.VolumeStatus.Image != nil {
				imageRef = m.VolumeStatus.Image.ImageRef
				if !m.ReadOnly || m.MountPath != "/img" {
					t.Errorf("volume mount status %+v, want read-only at /img", m)
				}
			}
		}
		if !strings.HasSuffix(imageRef, "@"+digest) {
			t.Errorf("volumeMounts[disk].volumeStatus.image.imageRef = %q, want one ending in @%s", imageRef, digest)
		}
		files, _ := filepath.Glob(filepath.Join(cache, "*", "rootfs", "disk", "data.img"))
		if len(files) != 1 {
			t.Fatalf("cache holds %v, want one unpacked data.img", files)
		}
		for _, p := range []string{cache, filepath.Dir(files[0]), files[0]} {
			st, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm()&0o022 != 0 || ownerUID(st) != 0 {
				t.Errorf("%s: mode %s uid %d, want root's and not writable by others", p, st.Mode(), ownerUID(st))
			}
		}
	})

	// As a kubelet with KubeletEnsureSecretPulledImages: an image this node pulled with one pod's
	// credentials is not handed from the cache to a pod without them, whatever its pull policy.
	t.Run("a cached private image needs the pod's own credentials", func(t *testing.T) {
		tc.t = t
		pod := imagePod("stranger", ref, "")
		pod.Spec.ImagePullSecrets = nil
		pod.Spec.NodeName = n.name
		tc.create(pod)
		got := tc.waitFor("stranger", "finished or failing to pull", func(p *corev1.Pod) bool {
			return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || waitingReason(p) == "ErrImagePull"
		})
		if waitingReason(got) != "ErrImagePull" || !strings.Contains(got.Status.ContainerStatuses[0].State.Waiting.Message, ref) {
			t.Fatalf("a pod without credentials: phase %s, container %+v; want ErrImagePull naming %s", got.Status.Phase, got.Status.ContainerStatuses[0].State, ref)
		}
		if err := client.CoreV1().Pods(tc.ns).Delete(ctx, "stranger", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		tc.waitGone("stranger")
	})

	// The access check asks the registry the image came from, not the one the pod names: a
	// registry that merely claims to hold the digest does not get the cached image either.
	t.Run("a registry claiming the digest does not get a cached private image", func(t *testing.T) {
		tc.t = t
		pod := imagePod("claimer", liar+"/x@"+digest, "")
		pod.Spec.ImagePullSecrets = nil
		pod.Spec.NodeName = n.name
		tc.create(pod)
		got := tc.waitFor("claimer", "finished or failing to pull", func(p *corev1.Pod) bool {
			return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || waitingReason(p) == "ErrImagePull"
		})
		if waitingReason(got) != "ErrImagePull" {
			t.Fatalf("a pod naming the digest in a registry that claims it: phase %s, container %+v; want ErrImagePull",
				got.Status.Phase, got.Status.ContainerStatuses[0].State)
		}
		if err := client.CoreV1().Pods(tc.ns).Delete(ctx, "claimer", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		tc.waitGone("claimer")
	})

	t.Run("a cache file changed after unpacking never reaches a pod", func(t *testing.T) {
		files, _ := filepath.Glob(filepath.Join(cache, "*", "rootfs", "disk", "data.img"))
		if len(files) != 1 {
			t.Fatalf("cache holds %v, want one unpacked data.img", files)
		}
		if err := os.WriteFile(files[0], []byte("tampered"), 0o644); err != nil {
			t.Fatal(err)
		}
		pod := run(t, "second")
		cs := pod.Status.ContainerStatuses[0]
		term := cs.State.Terminated
		switch {
		case pod.Status.Phase == corev1.PodSucceeded && term != nil && term.Message == "original":
			// Re-pulled.
		case waitingReason(pod) == "ErrImagePull" && strings.Contains(cs.State.Waiting.Message, ref):
			t.Logf("refused: %s", cs.State.Waiting.Message)
		default:
			t.Errorf("after tampering: phase %s, message %q, container %+v; want the original content or a refusal naming %s",
				pod.Status.Phase, pod.Status.Message, cs.State, ref)
		}
	})

	// As a kubelet: the pod stays Pending, its container waiting with ErrImagePull (the pull's
	// error), then ImagePullBackOff while the provider waits to pull again, and so on; once the
	// image can be had, the pod runs.
	t.Run("a failed pull is retried with back-off, reported as a kubelet reports it", func(t *testing.T) {
		tc.t = t
		later := addr + "/tenant/disk:later"
		pod := imagePod("later", later, "creds")
		pod.Spec.NodeName = n.name
		tc.create(pod)
		got := tc.waitFor("later", "waiting with ErrImagePull", func(p *corev1.Pod) bool { return waitingReason(p) == "ErrImagePull" })
		if msg := got.Status.ContainerStatuses[0].State.Waiting.Message; got.Status.Phase != corev1.PodPending || !strings.Contains(msg, later) {
			t.Errorf("phase %s, message %q; want Pending with the pull's error naming %s", got.Status.Phase, msg, later)
		}
		got = tc.waitFor("later", "waiting with ImagePullBackOff", func(p *corev1.Pod) bool { return waitingReason(p) == "ImagePullBackOff" })
		if msg := got.Status.ContainerStatuses[0].State.Waiting.Message; got.Status.Phase != corev1.PodPending || !strings.HasPrefix(msg, `Back-off pulling image "`+later+`": `) {
			t.Errorf("phase %s, message %q; want Pending, backing off from pulling %s", got.Status.Phase, msg, later)
		}
		tc.waitFor("later", "pulling again", func(p *corev1.Pod) bool { return waitingReason(p) == "ErrImagePull" })
		pushDisk(t, later, "tenant", "s3cret", "pushed later")
		got = tc.waitFor("later", "finished", func(p *corev1.Pod) bool {
			return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
		})
		if term := got.Status.ContainerStatuses[0].State.Terminated; got.Status.Phase != corev1.PodSucceeded || term == nil || term.Message != "pushed later" {
			t.Errorf("after the push: phase %s, container %+v; want it to run and read the image", got.Status.Phase, got.Status.ContainerStatuses[0].State)
		}
	})

	t.Run("without the pull secret the pull is refused, and the pod can be deleted meanwhile", func(t *testing.T) {
		tc.t = t
		pod := imagePod("anonymous", addr+"/tenant/disk:1", "")
		pod.Spec.ImagePullSecrets = nil
		pod.Spec.Volumes[0].Image.PullPolicy = corev1.PullAlways
		pod.Spec.NodeName = n.name
		tc.create(pod)
		got := tc.waitFor("anonymous", "waiting with ErrImagePull", func(p *corev1.Pod) bool { return waitingReason(p) == "ErrImagePull" })
		if msg := got.Status.ContainerStatuses[0].State.Waiting.Message; !strings.Contains(msg, ref) {
			t.Errorf("message %q, want one naming %s", msg, ref)
		}
		if err := client.CoreV1().Pods(tc.ns).Delete(ctx, "anonymous", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		tc.waitGone("anonymous")
	})
}

// lyingRegistry is a registry that answers every manifest HEAD by digest with that digest, as if
// it held every image, and has nothing to pull; it returns its host:port.
func lyingRegistry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/" {
			return
		}
		_, ref, ok := strings.Cut(r.URL.Path, "/manifests/")
		if r.Method != http.MethodHead || !ok || !strings.HasPrefix(ref, "sha256:") {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Docker-Content-Digest", ref)
		w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
		w.Header().Set("Content-Length", "500")
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// waitingReason is the reason the pod's first container waits, "" when it does not.
func waitingReason(p *corev1.Pod) string {
	if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Waiting == nil {
		return ""
	}
	return p.Status.ContainerStatuses[0].State.Waiting.Reason
}
