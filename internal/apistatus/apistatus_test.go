package apistatus_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/qvirt/qvirt/internal/apistatus"
)

// answer runs write against a real HTTP server and decodes what a client receives.
func answer(t *testing.T, write func(http.ResponseWriter)) (*http.Response, metav1.Status) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { write(w) }))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st metav1.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("body is not a Status: %v", err)
	}
	return resp, st
}

func TestWriteError(t *testing.T) {
	notFound := apierrors.NewNotFound(schema.GroupResource{Group: "qvirt.io", Resource: "virtualmachineinstances"}, "vm1")
	for _, tc := range []struct {
		name       string
		err        error
		code       int
		reason     metav1.StatusReason
		apiErrorIs func(error) bool
	}{
		{"status error", notFound, http.StatusNotFound, metav1.StatusReasonNotFound, apierrors.IsNotFound},
		{"wrapped status error", fmt.Errorf("pause: %w", apierrors.NewConflict(schema.GroupResource{Resource: "x"}, "y", errors.New("busy"))),
			http.StatusConflict, metav1.StatusReasonConflict, apierrors.IsConflict},
		{"plain error", errors.New("disk on fire"), http.StatusInternalServerError, metav1.StatusReasonInternalError, apierrors.IsInternalError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, st := answer(t, func(w http.ResponseWriter) { apistatus.WriteError(w, tc.err) })
			if resp.StatusCode != tc.code || st.Code != int32(tc.code) || st.Reason != tc.reason {
				t.Errorf("HTTP %d, status code %d reason %q; want %d %q", resp.StatusCode, st.Code, st.Reason, tc.code, tc.reason)
			}
			if st.Kind != "Status" || st.APIVersion != "v1" || resp.Header.Get("Content-Type") != "application/json" {
				t.Errorf("kind %q apiVersion %q content type %q", st.Kind, st.APIVersion, resp.Header.Get("Content-Type"))
			}
			if !tc.apiErrorIs(&apierrors.StatusError{ErrStatus: st}) {
				t.Errorf("a client does not read %+v as the same kind of error", st)
			}
		})
	}
}

func TestWriteWithoutCodeIs500(t *testing.T) {
	resp, st := answer(t, func(w http.ResponseWriter) { apistatus.Write(w, metav1.Status{Message: "?"}) })
	if resp.StatusCode != http.StatusInternalServerError || st.Code != http.StatusInternalServerError {
		t.Errorf("HTTP %d, status code %d; want 500", resp.StatusCode, st.Code)
	}
}

func TestWriteSuccess(t *testing.T) {
	resp, st := answer(t, func(w http.ResponseWriter) { apistatus.WriteSuccess(w, "VMI ns/vm1: pause done") })
	if resp.StatusCode != http.StatusOK || st.Status != metav1.StatusSuccess || st.Code != http.StatusOK || st.Message != "VMI ns/vm1: pause done" {
		t.Errorf("HTTP %d, status %+v", resp.StatusCode, st)
	}
}
