// Package imagepull pulls container images (kernelBoot and containerDisk) from OCI registries with
// go-containerregistry and unpacks them. Two caches use it:
//
//   - Store, a node's cache kept by one trusted process: a virtual node's provider implements the
//     launcher pods' image volumes with it, as the kubelet does on a real node.
//   - Cache, a user's cache for `qvirt-launcher run` outside Kubernetes, shared by that user's
//     launchers through cmd/qvirt-pull, a short-lived process: linking go-containerregistry into
//     the long-lived qvirt-launcher costs about 1.4 MiB of RSS per VM even when nothing is pulled.
package imagepull

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/qvirt/qvirt/internal/atomicfile"
)

// Cache pulls container images (kernelBoot and containerDisk) from registries and keeps
// them unpacked under Dir, one directory per image digest, so a user's launchers share one copy
// and a VM started again does not pull again. Everyone who can write Dir is trusted by everyone
// using it: it is one user's, never a node's (see Store):
//
//	Dir/sha256-<hex>/rootfs   the image's filesystem, complete once the directory exists
//	Dir/refs/<escaped ref>    the digest a reference resolved to (for IfNotPresent and Never)
//	Dir/sha256-<hex>.lock     flock held while one launcher pulls that digest
//	Dir/tmp-*                 unpacking in progress (renamed into place, or left by a crash)
//
// Safe for concurrent use by many processes: a digest is pulled once, under its lock, and
// unpacked into a temporary directory renamed into place. Images are never deleted here.
type Cache struct {
	Dir string
	// Insecure lists the registries (host:port, as written in image references) that may be
	// reached over plain HTTP. Every other registry is HTTPS only, loopback and private addresses
	// included: plain HTTP is never a silent fallback.
	Insecure []string
	// Timeout bounds one pull; 10 minutes when zero.
	Timeout time.Duration
}

// PullPolicy is when Rootfs contacts the registry, Kubernetes' imagePullPolicy (the same strings
// as PullPolicy, not imported to keep the puller small): Always resolves the tag at the
// registry every time (but downloads only a digest not in the cache), IfNotPresent uses what the
// reference resolved to last time, Never only the cache. Empty means IfNotPresent, or Always for
// an untagged or :latest reference, as for a container.
type PullPolicy string

// The pull policies.
const (
	PullAlways       PullPolicy = "Always"
	PullIfNotPresent PullPolicy = "IfNotPresent"
	PullNever        PullPolicy = "Never"
)

// Rootfs returns the directory holding image's filesystem, pulling the image when the policy says
// so. Errors say what failed in terms of the reference (bad reference, not found, unauthorized,
// plain HTTP refused, unsafe layer).
func (c Cache) Rootfs(ctx context.Context, image string, policy PullPolicy) (string, error) {
	if c.Dir == "" {
		return "", errors.New("no image cache directory is configured, so images cannot be pulled")
	}
	ref, err := c.parse(image)
	if err != nil {
		return "", err
	}
	if policy, err = effectivePolicy(ref, policy); err != nil {
		return "", err
	}
	if policy != PullAlways {
		if dir, ok := c.cached(ref); ok {
			return dir, nil
		}
		if policy == PullNever {
			return "", fmt.Errorf("image %s is not in this node's cache and imagePullPolicy is Never", image)
		}
	}
	timeout := c.Timeout
	if timeout == 0 {
		timeout = 10 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return c.pull(ctx, ref)
}

func (c Cache) parse(image string) (name.Reference, error) { return parseRef(image, c.Insecure) }

// parseRef parses an image reference, allowing plain HTTP for the registries in insecure only.
func parseRef(image string, insecure []string) (name.Reference, error) {
	ref, err := name.ParseReference(image)
	if err != nil {
		return nil, fmt.Errorf("not an image reference: %w", err)
	}
	if slices.Contains(insecure, ref.Context().RegistryStr()) {
		// Lets go-containerregistry fall back to HTTP; insecureTransport allows it.
		return name.ParseReference(image, name.Insecure)
	}
	return ref, nil
}

// effectivePolicy checks policy and gives an empty one Kubernetes' default for ref.
func effectivePolicy(ref name.Reference, policy PullPolicy) (PullPolicy, error) {
	switch policy {
	case "":
		return defaultPolicy(ref), nil
	case PullAlways, PullIfNotPresent, PullNever:
		return policy, nil
	}
	return "", fmt.Errorf("unknown imagePullPolicy %q: want Always, IfNotPresent or Never", policy)
}

func defaultPolicy(ref name.Reference) PullPolicy {
	if t, ok := ref.(name.Tag); ok && t.TagStr() == "latest" {
		return PullAlways
	}
	return PullIfNotPresent
}

// cached is the filesystem of a reference pulled before: a digest reference is its own key, a tag
// goes through the digest recorded when it was pulled.
func (c Cache) cached(ref name.Reference) (string, bool) {
	digest := ref.Identifier()
	if _, ok := ref.(name.Tag); ok {
		b, err := os.ReadFile(c.refFile(ref))
		if err != nil {
			return "", false
		}
		digest = strings.TrimSpace(string(b))
	}
	h, err := v1.NewHash(digest)
	if err != nil {
		return "", false
	}
	dir := c.rootfs(h)
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return "", false
	}
	return dir, true
}

func (c Cache) rootfs(h v1.Hash) string {
	return filepath.Join(c.Dir, h.Algorithm+"-"+h.Hex, "rootfs")
}

func (c Cache) refFile(ref name.Reference) string {
	return filepath.Join(c.Dir, "refs", url.PathEscape(ref.Name()))
}

// pull fetches the manifest (resolving a tag), and unless that digest is cached, the layers.
func (c Cache) pull(ctx context.Context, ref name.Reference) (string, error) {
	img, err := remote.Image(ref, remote.WithContext(ctx), remote.WithTransport(c.transport()),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}))
	if err != nil {
		return "", fmt.Errorf("pull %s: %w", ref.Name(), err)
	}
	h, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("pull %s: %w", ref.Name(), err)
	}
	if err := os.MkdirAll(filepath.Join(c.Dir, "refs"), 0o755); err != nil {
		return "", err
	}
	unlock, err := lockFile(filepath.Join(c.Dir, h.Algorithm+"-"+h.Hex+".lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	dir := c.rootfs(h)
	if _, err := os.Stat(dir); err != nil {
		if err := c.unpack(img, filepath.Dir(dir)); err != nil {
			return "", fmt.Errorf("pull %s: %w", ref.Name(), err)
		}
	}
	if err := writeAtomic(c.refFile(ref), []byte(h.String()+"\n")); err != nil {
		return "", err
	}
	return dir, nil
}

// unpack writes img's flattened filesystem to a temporary directory and renames it to final.
func (c Cache) unpack(img v1.Image, final string) error { return unpackImage(img, c.Dir, final) }

// unpackImage writes img's flattened filesystem to final/rootfs through a temporary directory in
// dir, renamed into place once complete.
func unpackImage(img v1.Image, dir, final string) error {
	tmp, err := os.MkdirTemp(dir, "tmp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	rootfs := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return err
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	if err := unpackTar(rc, rootfs, maxUnpackBytes); err != nil {
		return err
	}
	// mutate.Extract ends the tar stream cleanly even when a layer failed (a digest mismatch, an
	// unsafe path it refuses): the failure comes after the tar trailer, at the pipe's end.
	if _, err := io.Copy(io.Discard, rc); err != nil {
		return fmt.Errorf("read image layers: %w", err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	return os.Rename(tmp, final)
}

// transport refuses plain HTTP to any registry not listed in Insecure.
func (c Cache) transport() http.RoundTripper { return newTransport(c.Insecure) }

func newTransport(insecure []string) http.RoundTripper {
	return insecureTransport{next: remote.DefaultTransport, allowed: insecure}
}

type insecureTransport struct {
	next    http.RoundTripper
	allowed []string
}

// PlainHTTPError is a registry reached over plain HTTP without being listed as insecure.
type PlainHTTPError struct{ Host string }

func (e *PlainHTTPError) Error() string {
	return fmt.Sprintf("plain HTTP to registry %s refused: list it with --insecure-registry %s if it has no TLS", e.Host, e.Host)
}

func (t insecureTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" && !slices.Contains(t.allowed, req.URL.Host) {
		return nil, &PlainHTTPError{Host: req.URL.Host}
	}
	return t.next.RoundTrip(req)
}

// lockFile takes an exclusive flock on path, shared with other launchers on the node.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { _ = f.Close() }, nil
}

// writeAtomic replaces path with data, readable by all as the cache's other files are.
func writeAtomic(path string, data []byte) error {
	return atomicfile.Write(path, 0o644, func(f *os.File) error { _, err := f.Write(data); return err })
}
