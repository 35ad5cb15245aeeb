package cli

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	subv1 "github.com/qvirt/qvirt/api/subresources/v1alpha1"
)

// exitError ends qvirtctl with a specific exit code after printing err.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// hintError is an error followed by advice for the user.
type hintError struct {
	err  error
	hint string
}

func (e *hintError) Error() string { return e.err.Error() }
func (e *hintError) Unwrap() error { return e.err }

// withHint attaches advice to err (nil stays nil).
func withHint(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return &hintError{err: err, hint: fmt.Sprintf(format, args...)}
}

// FormatError renders err as kubectl does ("Error from server (NotFound): ..." for API errors,
// "error: ..." otherwise), followed by what to do about it when we know.
func FormatError(err error) string {
	var b strings.Builder
	var se *apierrors.StatusError
	if errors.As(err, &se) {
		b.WriteString(serverError(se.ErrStatus))
	} else {
		b.WriteString("error: " + err.Error())
	}
	var he *hintError
	if errors.As(err, &he) && he.hint != "" {
		b.WriteString("\n" + he.hint)
	} else if hint := statusHint(err); hint != "" {
		b.WriteString("\n" + hint)
	}
	return b.String()
}

func serverError(st metav1.Status) string {
	reason := string(st.Reason)
	if reason == "" || st.Reason == metav1.StatusReasonUnknown {
		return "Error from server: " + st.Message
	}
	return fmt.Sprintf("Error from server (%s): %s", reason, st.Message)
}

// statusHint is generic advice for an API error.
func statusHint(err error) string {
	switch {
	case apierrors.IsForbidden(err):
		return "Ask a cluster administrator for a role that allows it: qvirt.io:view reads, qvirt.io:edit also opens consoles and runs actions, qvirt.io:admin also sends QMP write commands."
	case apierrors.IsUnauthorized(err):
		return "Your credentials were refused: check the user of the current context (kubectl config view --minify)."
	case serviceMissing(err):
		return "Is qvirt-api installed and available? Check: kubectl get apiservice " + subv1.GroupVersion.Version + "." + subv1.GroupVersion.Group
	}
	return ""
}

// serviceMissing reports a 503 from the aggregator or a 404 for the group itself.
func serviceMissing(err error) bool {
	var se *apierrors.StatusError
	if !errors.As(err, &se) {
		return false
	}
	st := se.ErrStatus
	if st.Code == http.StatusServiceUnavailable {
		return true
	}
	return st.Code == http.StatusNotFound && (st.Details == nil || st.Details.Name == "")
}
