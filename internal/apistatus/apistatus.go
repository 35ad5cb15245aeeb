// Package apistatus writes HTTP answers as kube-apiserver does: a metav1.Status body whose code is
// also the response's. qvirt-api's subresources and qvirt-handler's stream server both answer
// this way, and qvirt-api relays a handler's Status to the user unchanged, so both write it with
// this one package. It is internal plumbing, not part of the subresources contract (which only
// says errors are metav1.Status bodies): it holds no types, only the writer.
package apistatus

import (
	"encoding/json"
	"errors"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// WriteError answers err as its metav1.Status (an apierrors.APIStatus anywhere in its chain);
// any other error is a 500 InternalError quoting it.
func WriteError(w http.ResponseWriter, err error) {
	var se apierrors.APIStatus
	if !errors.As(err, &se) {
		se = apierrors.NewInternalError(err)
	}
	Write(w, se.Status())
}

// WriteSuccess answers 200 with a Success status carrying msg, for an action without a result.
func WriteSuccess(w http.ResponseWriter, msg string) {
	Write(w, metav1.Status{Status: metav1.StatusSuccess, Code: http.StatusOK, Message: msg})
}

// Write answers st as JSON with st.Code as the HTTP status (500 when unset), filling in its kind
// and apiVersion so that clients decode it as a Status.
func Write(w http.ResponseWriter, st metav1.Status) {
	st.Kind, st.APIVersion = "Status", "v1"
	if st.Code == 0 {
		st.Code = http.StatusInternalServerError
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(int(st.Code))
	_ = json.NewEncoder(w).Encode(st)
}
