package apiserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// writeError answers err as a metav1.Status with its code; an error that is not an APIStatus is 500.
func writeError(w http.ResponseWriter, err error) {
	var se apierrors.APIStatus
	if !errors.As(err, &se) {
		se = apierrors.NewInternalError(err)
	}
	writeStatus(w, se.Status())
}

func writeStatus(w http.ResponseWriter, st metav1.Status) {
	st.Kind, st.APIVersion = "Status", "v1"
	if st.Code == 0 {
		st.Code = http.StatusInternalServerError
	}
	writeJSON(w, int(st.Code), st)
}

func writeSuccess(w http.ResponseWriter, msg string) {
	writeStatus(w, metav1.Status{Status: metav1.StatusSuccess, Code: http.StatusOK, Message: msg})
}

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
