package wire

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// Mux routes a request by method and path. A pattern is "METHOD /a/b" or "METHOD /a/{name}": a
// {name} segment matches any one non-empty segment, read with Request.PathValue.
type Mux struct {
	routes   []route
	notFound func(w *ResponseWriter, code int, msg string)
}

type route struct {
	method string
	segs   []string
	h      HandlerFunc
}

// NewMux returns a Mux that refuses an unknown path (404) or method (405) through refuse.
func NewMux(refuse func(w *ResponseWriter, code int, msg string)) *Mux {
	return &Mux{notFound: refuse}
}

// HandleFunc adds a route; a malformed pattern is a programming error and panics at start-up.
func (m *Mux) HandleFunc(pattern string, h HandlerFunc) {
	method, path, ok := strings.Cut(pattern, " ")
	if !ok || !strings.HasPrefix(path, "/") {
		panic(fmt.Sprintf("wire: pattern %q: want \"METHOD /path\"", pattern))
	}
	m.routes = append(m.routes, route{method: method, segs: strings.Split(path[1:], "/"), h: h})
}

// Serve is the Mux as a Server's Handler. It matches the escaped path segment by segment, so an
// escaped "/" stays inside its segment's value.
func (m *Mux) Serve(w *ResponseWriter, r *Request) {
	segs := strings.Split(strings.TrimPrefix(r.rawPath, "/"), "/")
	for i, seg := range segs {
		if s, err := url.PathUnescape(seg); err == nil {
			segs[i] = s
		}
	}
	var allowed []string
	for _, rt := range m.routes {
		params, ok := rt.match(segs)
		if !ok {
			continue
		}
		// A GET route answers HEAD too, with its headers only.
		if rt.method != r.Method && (rt.method != "GET" || r.Method != "HEAD") {
			allowed = append(allowed, rt.method)
			continue
		}
		r.params = params
		rt.h(w, r)
		return
	}
	if len(allowed) > 0 {
		slices.Sort(allowed)
		w.Header().Set("Allow", strings.Join(slices.Compact(allowed), ", "))
		m.notFound(w, StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s", r.Method, r.Path))
		return
	}
	m.notFound(w, StatusNotFound, fmt.Sprintf("no such path: %s", r.Path))
}

func (rt route) match(segs []string) (map[string]string, bool) {
	if len(segs) != len(rt.segs) {
		return nil, false
	}
	var params map[string]string
	for i, want := range rt.segs {
		if name, ok := strings.CutPrefix(want, "{"); ok && strings.HasSuffix(name, "}") {
			if segs[i] == "" {
				return nil, false
			}
			if params == nil {
				params = map[string]string{}
			}
			params[strings.TrimSuffix(name, "}")] = segs[i]
			continue
		}
		if segs[i] != want {
			return nil, false
		}
	}
	return params, true
}
