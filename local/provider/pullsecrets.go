package provider

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	corev1 "k8s.io/api/core/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
)

// dockerAuth is one registry's entry of a .dockerconfigjson (or legacy .dockercfg) Secret.
type dockerAuth struct {
	Username      string `json:"username,omitempty"`
	Password      string `json:"password,omitempty"`
	Auth          string `json:"auth,omitempty"`
	IdentityToken string `json:"identitytoken,omitempty"`
	RegistryToken string `json:"registrytoken,omitempty"`
}

// pullKeychain holds a pod's imagePullSecrets, by registry host, in the order the pod lists them.
type pullKeychain map[string]authn.AuthConfig

// podKeychain reads the pod's imagePullSecrets as the kubelet does: a missing or malformed Secret
// is skipped (the pull then goes without it and fails if the registry needs it), and the first
// Secret naming a registry wins. Only the provider, standing in for the kubelet, reads them; the
// node agent never does.
func podKeychain(pod *corev1.Pod, secrets corev1listers.SecretLister) (pullKeychain, []error) {
	k := pullKeychain{}
	var skipped []error
	for _, ref := range pod.Spec.ImagePullSecrets {
		if ref.Name == "" {
			continue
		}
		s, err := secrets.Secrets(pod.Namespace).Get(ref.Name)
		if err != nil {
			skipped = append(skipped, fmt.Errorf("imagePullSecret %s: %w", ref.Name, err))
			continue
		}
		auths, err := secretAuths(s)
		if err != nil {
			skipped = append(skipped, fmt.Errorf("imagePullSecret %s: %w", ref.Name, err))
			continue
		}
		for host, a := range auths {
			if _, ok := k[registryHost(host)]; !ok {
				k[registryHost(host)] = a
			}
		}
	}
	return k, skipped
}

func secretAuths(s *corev1.Secret) (map[string]authn.AuthConfig, error) {
	var auths map[string]dockerAuth
	switch s.Type {
	case corev1.SecretTypeDockerConfigJson:
		var cfg struct {
			Auths map[string]dockerAuth `json:"auths"`
		}
		if err := json.Unmarshal(s.Data[corev1.DockerConfigJsonKey], &cfg); err != nil {
			return nil, err
		}
		auths = cfg.Auths
	case corev1.SecretTypeDockercfg:
		if err := json.Unmarshal(s.Data[corev1.DockerConfigKey], &auths); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("type %s is not %s", s.Type, corev1.SecretTypeDockerConfigJson)
	}
	out := map[string]authn.AuthConfig{}
	for host, a := range auths {
		c := authn.AuthConfig{Username: a.Username, Password: a.Password, IdentityToken: a.IdentityToken, RegistryToken: a.RegistryToken}
		if a.Auth != "" && c.Username == "" {
			b, err := base64.StdEncoding.DecodeString(a.Auth)
			if err != nil {
				return nil, fmt.Errorf("auth of %s: %w", host, err)
			}
			c.Username, c.Password, _ = strings.Cut(string(b), ":")
		}
		out[host] = c
	}
	return out, nil
}

// registryHost is the host[:port] of a docker config key, which may be a URL
// ("https://index.docker.io/v1/") or carry a path.
func registryHost(key string) string {
	if u, err := url.Parse(key); err == nil && u.Host != "" {
		key = u.Host
	}
	key, _, _ = strings.Cut(key, "/")
	if key == "docker.io" {
		return "index.docker.io"
	}
	return key
}

// Resolve implements authn.Keychain.
func (k pullKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	if c, ok := k[registryHost(r.RegistryStr())]; ok {
		return authn.FromConfig(c), nil
	}
	return authn.Anonymous, nil
}
