package images

import (
	"context"
	"fmt"
	"net"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Pushed is an image Push wrote to a registry.
type Pushed struct {
	Ref    string // registry/qvirt/name:latest
	Digest v1.Hash
}

// Push pushes every image of the layout at dir to registry (host:port), under the reference it
// was stored with. Plain HTTP is used for a loopback registry (local mode's) or when insecure is
// set; anything else must speak HTTPS.
func Push(ctx context.Context, dir, registry string, insecure bool) ([]Pushed, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("image layout %s (run make images first): %w", dir, err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var opts []name.Option
	if insecure || isLoopback(registry) {
		opts = append(opts, name.Insecure)
	}
	var out []Pushed
	for _, d := range im.Manifests {
		refName := d.Annotations["org.opencontainers.image.ref.name"]
		if refName == "" {
			return nil, fmt.Errorf("image %s in %s has no reference name", d.Digest, dir)
		}
		ref, err := name.ParseReference(registry+"/"+refName, opts...)
		if err != nil {
			return nil, fmt.Errorf("registry %q: %w", registry, err)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			return nil, err
		}
		if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
			return nil, fmt.Errorf("push %s: %w", ref, err)
		}
		out = append(out, Pushed{Ref: ref.String(), Digest: d.Digest})
	}
	return out, nil
}

func isLoopback(registry string) bool {
	host, _, err := net.SplitHostPort(registry)
	if err != nil {
		host = registry
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
