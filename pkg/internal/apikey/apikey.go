// Package apikey checks the API key the gateway sends to the engines on its
// own requests (vLLM's --api-key).
package apikey

import (
	"errors"
	"fmt"
	"strings"
)

// Check reports whether key can be sent as an engine's API key: empty, or
// printable ASCII (inner spaces included) with no white space at either
// end, which is all an HTTP header carries unchanged and all vLLM matches.
// Its error does not contain the key.
func Check(key string) error {
	if key != strings.TrimSpace(key) {
		return errors.New("begins or ends with white space")
	}
	for i := range len(key) {
		if b := key[i]; b < ' ' || b > '~' {
			return fmt.Errorf("byte %d is not printable ASCII", i)
		}
	}
	return nil
}
