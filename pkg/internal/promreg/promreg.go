// Package promreg registers a component's Prometheus collectors as one:
// all of them, or none.
package promreg

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers every collector on reg, or, when one fails (a
// collector of the same name is already there), unregisters those it
// registered and returns the errors, prefixed with what: a component never
// runs with half of its metrics. A nil reg registers nothing.
func Register(reg prometheus.Registerer, what string, collectors ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	var errs []error
	var registered []prometheus.Collector
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
			continue
		}
		registered = append(registered, c)
	}
	if err := errors.Join(errs...); err != nil {
		for _, c := range registered {
			reg.Unregister(c)
		}
		return fmt.Errorf("register %s metrics: %w", what, err)
	}
	return nil
}
