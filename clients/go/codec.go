package idem

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Codec turns a work's result into the bytes stored by DONE and back. A
// replay decodes into a new value of the work's result type.
type Codec interface {
	Encode(v any) ([]byte, error)
	Decode(data []byte, v any) error
}

// JSONCodec is the default Codec: compact JSON (encoding/json, without
// HTML escaping), as the other languages' libraries store it.
type JSONCodec struct{}

// Encode is json.Marshal without HTML escaping.
func (JSONCodec) Encode(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// Decode is json.Unmarshal.
func (JSONCodec) Decode(data []byte, v any) error { return json.Unmarshal(data, v) }

// BytesCodec stores a []byte or string result as it is and replays it as
// a []byte or string, for results already encoded.
type BytesCodec struct{}

// Encode takes a []byte or a string.
func (BytesCodec) Encode(v any) ([]byte, error) {
	switch b := v.(type) {
	case []byte:
		return b, nil
	case string:
		return []byte(b), nil
	}
	return nil, fmt.Errorf("idem: BytesCodec encodes []byte or string, not %T", v)
}

// Decode fills a *[]byte, a *string or a *any (with a []byte).
func (BytesCodec) Decode(data []byte, v any) error {
	switch p := v.(type) {
	case *[]byte:
		*p = append([]byte(nil), data...)
	case *string:
		*p = string(data)
	case *any:
		*p = append([]byte(nil), data...)
	default:
		return fmt.Errorf("idem: BytesCodec decodes into *[]byte or *string, not %T", v)
	}
	return nil
}
