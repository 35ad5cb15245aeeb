package guestagent

import (
	"encoding/json"
	"reflect"
)

// capped is a JSON array of which at most MaxItems elements are decoded; the rest are dropped
// undecoded, so a reply of a million tiny elements costs no more memory than its bytes.
type capped[T any] []T

// UnmarshalJSON decodes the first MaxItems elements (firstItems).
func (c *capped[T]) UnmarshalJSON(b []byte) error {
	out, err := firstItems[T](b, MaxItems)
	if err != nil {
		return err
	}
	*c = out
	return nil
}

// firstItems decodes the first n elements (n > 0) of the JSON array b with one json.Unmarshal (nil
// for null). The encoding/json package hands an Unmarshaler a value it has already checked to be valid
// JSON, so the elements past n need no check of their own, and the cut is found by counting the
// array's own commas, outside strings and nested values.
func firstItems[T any](b []byte, n int) ([]T, error) {
	if string(b) == "null" {
		return nil, nil
	}
	if len(b) == 0 || b[0] != '[' {
		// encoding/json adds the field's path to a type error: which list of the reply was wrong.
		// The type named is any list's; capped's own name would spell out T's fields.
		return nil, &json.UnmarshalTypeError{Value: jsonKind(b), Type: reflect.TypeFor[[]any]()}
	}
	if end, more := itemsEnd(b, n); more {
		b = append(b[:end:end], ']') // a copy: b is the caller's
	}
	var out []T
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// jsonKind names the kind of the valid JSON value b, as encoding/json's type errors do.
func jsonKind(b []byte) string {
	switch {
	case len(b) == 0:
		return "nothing"
	case b[0] == '{':
		return "object"
	case b[0] == '"':
		return "string"
	case b[0] == 't' || b[0] == 'f':
		return "bool"
	}
	return "number"
}

// itemsEnd returns the offset of the comma after the n-th element (n > 0) of the valid JSON array
// b, and whether there is one (b has more than n elements).
func itemsEnd(b []byte, n int) (int, bool) {
	depth := 0
	inString, escaped := false, false
	for i := 1; i < len(b); i++ {
		ch := b[i]
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case ch == '\\':
				escaped = true
			case ch == '"':
				inString = false
			}
		case ch == '"':
			inString = true
		case ch == '[' || ch == '{':
			depth++
		case ch == ']' || ch == '}':
			depth--
		case ch == ',' && depth == 0:
			if n--; n == 0 {
				return i, true
			}
		}
	}
	return 0, false
}
