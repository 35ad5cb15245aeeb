package guestagent

import (
	"bytes"
	"encoding/json"
	"errors"
)

// capped is a JSON array of which at most MaxItems elements are decoded; the rest are checked to
// be JSON and dropped, so a reply of a million tiny elements costs no more memory than its bytes.
type capped[T any] []T

func (c *capped[T]) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*c = nil
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return errors.New("expected a JSON array")
	}
	out := capped[T]{}
	var skip json.RawMessage
	for dec.More() {
		if len(out) == MaxItems {
			if err := dec.Decode(&skip); err != nil {
				return err
			}
			continue
		}
		var v T
		if err := dec.Decode(&v); err != nil {
			return err
		}
		out = append(out, v)
	}
	*c = out
	return nil
}
