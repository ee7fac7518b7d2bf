package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
)

// maxFormParts bounds the parts of a multipart/form-data body read for its
// model field: a body that names no model within its first maxFormParts
// parts is refused as naming none.
const maxFormParts = 64

// maxFormModelBytes bounds the model field of a multipart/form-data body:
// a longer value is refused, since no model is named so long.
const maxFormModelBytes = 4 << 10

// errFormModelTooLong reports a model field beyond maxFormModelBytes.
var errFormModelTooLong = fmt.Errorf("the model field is longer than %d bytes", maxFormModelBytes)

// errNotForm reports a content type that is not multipart/form-data with a
// boundary.
var errNotForm = errors.New("not a multipart/form-data body with a boundary")

// formModel returns the value of the model field of body, a
// multipart/form-data body whose Content-Type is contentType, and whether
// the body has one among its first maxFormParts parts. It reads the body
// in place: the parts before the model field are skipped, not kept, and
// only the model's value is copied, up to maxFormModelBytes.
func formModel(body []byte, contentType string) (string, bool, error) {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		return "", false, errNotForm
	}
	mr := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	for range maxFormParts {
		p, err := mr.NextPart()
		if err == io.EOF {
			return "", false, nil
		}
		if err != nil {
			return "", false, err
		}
		if p.FormName() != "model" || p.FileName() != "" {
			continue
		}
		value, err := io.ReadAll(io.LimitReader(p, maxFormModelBytes+1))
		if err != nil {
			return "", false, err
		}
		if len(value) > maxFormModelBytes {
			return "", false, errFormModelTooLong
		}
		return string(value), true, nil
	}
	return "", false, nil
}
