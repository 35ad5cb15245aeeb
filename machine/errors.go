package machine

import (
	"fmt"
	"strconv"
	"strings"
)

// Path is a field path into a request ("disks[2].bus"), the launcher's counterpart of
// apimachinery's field.Path, which it does not link.
type Path string

// Child appends .name for each name.
func (p Path) Child(names ...string) Path {
	for _, n := range names {
		if p == "" {
			p = Path(n)
			continue
		}
		p += "." + Path(n)
	}
	return p
}

// Index appends [i].
func (p Path) Index(i int) Path { return p + Path("["+strconv.Itoa(i)+"]") }

// Key appends [key].
func (p Path) Key(k string) Path { return p + Path("["+k+"]") }

// FieldError is a request field at fault: the launcher replies 400 with it, naming Field.
type FieldError struct {
	Field  string
	Detail string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Detail }

// Invalid is a field whose value v is wrong for the reason detail.
func Invalid(p Path, v any, detail string) *FieldError {
	return &FieldError{Field: string(p), Detail: fmt.Sprintf("invalid value %q: %s", fmt.Sprint(v), detail)}
}

// Required is a missing field.
func Required(p Path, detail string) *FieldError {
	return &FieldError{Field: string(p), Detail: "required: " + detail}
}

// Duplicate is a value that must be unique.
func Duplicate(p Path, v any) *FieldError {
	return &FieldError{Field: string(p), Detail: fmt.Sprintf("duplicate value: %v", v)}
}

// NotSupported is a value outside valid.
func NotSupported(p Path, v any, valid []string) *FieldError {
	return &FieldError{Field: string(p), Detail: fmt.Sprintf("unsupported value %q: supported: %s", fmt.Sprint(v), strings.Join(valid, ", "))}
}

// Forbidden is a field that may not be set here.
func Forbidden(p Path, detail string) *FieldError {
	return &FieldError{Field: string(p), Detail: "forbidden: " + detail}
}

// FieldErrors are several problems at once; errors.As finds each *FieldError.
type FieldErrors []*FieldError

func (l FieldErrors) Error() string {
	msgs := make([]string, len(l))
	for i, e := range l {
		msgs[i] = e.Error()
	}
	if len(msgs) == 1 {
		return msgs[0]
	}
	return "[" + strings.Join(msgs, ", ") + "]"
}

// Unwrap returns the individual errors.
func (l FieldErrors) Unwrap() []error {
	out := make([]error, len(l))
	for i, e := range l {
		out[i] = e
	}
	return out
}

// Err is l as an error, nil when l is empty.
func (l FieldErrors) Err() error {
	if len(l) == 0 {
		return nil
	}
	return l
}
