package apiserver

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qvirt/qvirt/internal/apistatus"
)

// writeError and writeSuccess are this package's short names for apistatus, which qvirt-handler
// answers with too: a handler's Status relayed by handlerError reads like one of ours.
func writeError(w http.ResponseWriter, err error) { apistatus.WriteError(w, err) }

func writeSuccess(w http.ResponseWriter, msg string) { apistatus.WriteSuccess(w, msg) }

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// handlerError turns a handler's non-2xx answer into an error to relay: its metav1.Status as is
// (the handler writes one for every failure), anything else as a 502 quoting it.
func handlerError(t target, resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var st metav1.Status
	if json.Unmarshal(data, &st) == nil && st.Kind == "Status" && st.Code != 0 {
		return &apierrors.StatusError{ErrStatus: st}
	}
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusBadGateway, Reason: metav1.StatusReasonInternalError,
		Message: fmt.Sprintf("qvirt-handler at %s answered %s for VMI %s: %.200q", t.addr, resp.Status, t.key(), data),
	}}
}
