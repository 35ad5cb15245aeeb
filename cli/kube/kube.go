// Package kube builds qvirtctl's connection to a cluster the way kubectl does: the kubeconfig
// chain (--kubeconfig, else $KUBECONFIG, else ~/.kube/config), --context, -n/--namespace (default:
// the context's namespace, else "default") and the other kubectl override flags. The same
// authenticated transport carries plain HTTP calls to qvirt-api's subresources, websocket
// streams (forced to HTTP/1.1, since a websocket upgrade cannot ride HTTP/2) and watches of
// qvirt objects.
package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/coder/websocket"
	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	qv1 "github.com/qvirt/qvirt/api/v1alpha1"
)

// Flags are kubectl's connection flags. Bind them once on the root command's persistent flags;
// Connect reads them when a command runs.
type Flags struct {
	rules     *clientcmd.ClientConfigLoadingRules
	overrides clientcmd.ConfigOverrides
}

// NewFlags returns flags using the default loading rules ($KUBECONFIG, ~/.kube/config).
func NewFlags() *Flags {
	return &Flags{rules: clientcmd.NewDefaultClientConfigLoadingRules()}
}

// Bind adds --kubeconfig, --context, -n/--namespace, --server, --token, --user, --cluster and the
// other kubectl override flags to fs.
func (f *Flags) Bind(fs *pflag.FlagSet) {
	fs.StringVar(&f.rules.ExplicitPath, clientcmd.RecommendedConfigPathFlag, "", "path to the kubeconfig file to use (default: $KUBECONFIG, else ~/.kube/config)")
	clientcmd.BindOverrideFlags(&f.overrides, fs, clientcmd.RecommendedConfigOverrideFlags(""))
}

// Client is a connection to one cluster and namespace.
type Client struct {
	// Config is the resolved REST config.
	Config *rest.Config
	// Namespace is -n, else the context's namespace, else "default".
	Namespace string
	// Objects reads and watches qvirt.io objects.
	Objects client.WithWatch
	http    *http.Client
}

// Connect resolves the kubeconfig and flags into a Client.
func (f *Flags) Connect() (*Client, error) {
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(f.rules, &f.overrides)
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig namespace: %w", err)
	}
	return newClient(cfg, ns)
}

// Scheme knows qvirt.io/v1alpha1 and metav1.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = qv1.AddToScheme(s)
	metav1.AddToGroupVersion(s, metav1.SchemeGroupVersion)
	return s
}

func newClient(cfg *rest.Config, ns string) (*Client, error) {
	cfg = rest.CopyConfig(cfg)
	if cfg.UserAgent == "" {
		cfg.UserAgent = "qvirtctl"
	}
	// kubectl's limits: client-go's default of 5 requests a second makes a command that polls
	// (console waiting for its VMI, migrate --wait) stall behind its own discovery requests.
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 300
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("HTTP client for %s: %w", cfg.Host, err)
	}
	objs, err := client.NewWithWatch(cfg, client.Options{Scheme: Scheme(), HTTPClient: hc})
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", cfg.Host, err)
	}
	return &Client{Config: cfg, Namespace: ns, Objects: objs, http: hc}, nil
}

// URL is the absolute URL of an API path on the cluster.
func (c *Client) URL(path string) (*url.URL, error) {
	base, err := url.Parse(c.Config.Host)
	if err != nil {
		return nil, fmt.Errorf("server address %q: %w", c.Config.Host, err)
	}
	if base.Scheme == "" {
		// rest.Config allows a bare host:port; kubectl assumes https then.
		base, err = url.Parse("https://" + c.Config.Host)
		if err != nil {
			return nil, fmt.Errorf("server address %q: %w", c.Config.Host, err)
		}
	}
	base.Path = strings.TrimSuffix(base.Path, "/") + path
	return base, nil
}

// Do sends method to path with body encoded as JSON (none when nil) and returns the response
// body. A non-2xx answer is an *apierrors.StatusError decoded from its metav1.Status body.
func (c *Client) Do(ctx context.Context, method, path string, body any) ([]byte, error) {
	u, err := c.URL(path)
	if err != nil {
		return nil, err
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("encode request body: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json, */*")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("read answer of %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return nil, StatusError(resp.StatusCode, method, path, b)
	}
	return b, nil
}

// StatusError turns an error answer into an *apierrors.StatusError: the body's metav1.Status when
// it is one, else a generic error for the HTTP code carrying the body's text.
func StatusError(code int, method, path string, body []byte) error {
	var st metav1.Status
	if json.Unmarshal(body, &st) == nil && st.Kind == "Status" {
		if st.Code == 0 {
			st.Code = int32(code)
		}
		if st.Status == "" {
			st.Status = metav1.StatusFailure
		}
		return &apierrors.StatusError{ErrStatus: st}
	}
	msg := strings.TrimSpace(string(body))
	if len(msg) > 512 {
		msg = msg[:512] + "..."
	}
	return apierrors.NewGenericServerResponse(code, method, schemaResource(path), "", msg, 0, true)
}

// Dial opens a websocket on path offering subprotocol, through the cluster with the user's
// credentials. A refused upgrade is an *apierrors.StatusError as from Do.
func (c *Client) Dial(ctx context.Context, path, subprotocol string) (*websocket.Conn, error) {
	u, err := c.URL(path)
	if err != nil {
		return nil, err
	}
	cfg := rest.CopyConfig(c.Config)
	// kube-apiserver proxies upgrades over HTTP/1.1 only; offering h2 in ALPN would let Go's
	// transport pick HTTP/2 and the upgrade would fail.
	cfg.NextProtos = []string{"http/1.1"}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("transport for %s: %w", cfg.Host, err)
	}
	conn, resp, err := websocket.Dial(ctx, u.String(), &websocket.DialOptions{
		HTTPClient:   &http.Client{Transport: rt},
		Subprotocols: []string{subprotocol},
	})
	if err == nil {
		return conn, nil
	}
	if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return nil, StatusError(resp.StatusCode, http.MethodGet, path, b)
	}
	return nil, fmt.Errorf("open websocket %s: %w", path, err)
}

// schemaResource is a best-effort resource for generic errors: the path's subresource parent.
func schemaResource(path string) schema.GroupResource {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i, p := range parts {
		if p == "namespaces" && i+2 < len(parts) {
			return schema.GroupResource{Resource: parts[i+2]}
		}
	}
	return schema.GroupResource{}
}
