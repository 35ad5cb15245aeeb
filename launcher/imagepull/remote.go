package imagepull

import (
	"context"
	"fmt"
	"runtime"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// puller reaches one reference's registry with the credentials of the pod that asked for it.
type puller struct {
	ref      name.Reference
	insecure []string
	auth     authn.Keychain
}

func (p puller) options(ctx context.Context) []remote.Option {
	auth := p.auth
	if auth == nil {
		auth = authn.NewMultiKeychain() // anonymous
	}
	return []remote.Option{remote.WithContext(ctx), remote.WithTransport(newTransport(p.insecure)), remote.WithAuthFromKeychain(auth),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH})}
}

// resolve asks the registry which digest the reference names (for this platform, through an
// index).
func (p puller) resolve(ctx context.Context) (string, error) {
	img, err := remote.Image(p.ref, p.options(ctx)...)
	if err != nil {
		return "", fmt.Errorf("pull: %w", err)
	}
	h, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("pull: %w", err)
	}
	return h.String(), nil
}

// credentialed tells whether the pull presents credentials to the reference's registry.
func (p puller) credentialed() bool {
	if p.auth == nil {
		return false
	}
	a, err := p.auth.Resolve(p.ref.Context())
	return err == nil && a != authn.Anonymous
}

// check asks the registry whether the pull's credentials give access to digest in the
// reference's repository, without fetching it.
func (p puller) check(ctx context.Context, digest string) error {
	if _, err := remote.Head(p.ref.Context().Digest(digest), p.options(ctx)...); err != nil {
		return fmt.Errorf("check access to %s: %w", digest, err)
	}
	return nil
}

// image is the image of digest in the reference's repository; go-containerregistry checks the
// manifest and every layer against their digests as they are read.
func (p puller) image(ctx context.Context, digest string) (v1.Image, error) {
	img, err := remote.Image(p.ref.Context().Digest(digest), p.options(ctx)...)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", digest, err)
	}
	return img, nil
}
