package cache

import (
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/pkg/endpoint"
)

// Sentinel errors. The typed errors below wrap them, so callers test the kind
// with errors.Is and read the details with errors.As.
var (
	// ErrPodNotFound reports a pod the Store does not know.
	ErrPodNotFound = errors.New("pod not found")
	// ErrModelNotFound reports a model no known pod serves.
	ErrModelNotFound = errors.New("model not found")
	// ErrMetricNotFound reports a metric the Store holds no value for.
	ErrMetricNotFound = errors.New("metric not found")
	// ErrMissingProfile reports a model and deployment without a GPU
	// profile.
	ErrMissingProfile = errors.New("missing profile")
	// ErrSLOFailureRequest is returned by LoadProvider.GetConsumption when
	// the pod cannot serve the request within its SLO at all (its profiled
	// throughput for the request's shape is zero), so the request may be
	// rejected early.
	ErrSLOFailureRequest = errors.New("slo failure request")
	// ErrLoadCapacityReached reports that no pod can take a request within
	// its SLO now, though one could once its load drains: the request may
	// wait for capacity.
	ErrLoadCapacityReached = errors.New("load capacity reached")
)

// PodNotFoundError reports a pod the Store does not know. It wraps
// ErrPodNotFound.
type PodNotFoundError struct {
	Key endpoint.Key
}

func (e *PodNotFoundError) Error() string {
	return fmt.Sprintf("pod %s not found", e.Key)
}

// Unwrap returns ErrPodNotFound.
func (e *PodNotFoundError) Unwrap() error { return ErrPodNotFound }

// ModelNotFoundError reports a model no known pod serves. It wraps
// ErrModelNotFound.
type ModelNotFoundError struct {
	Model string
}

func (e *ModelNotFoundError) Error() string {
	return fmt.Sprintf("model %q not found", e.Model)
}

// Unwrap returns ErrModelNotFound.
func (e *ModelNotFoundError) Unwrap() error { return ErrModelNotFound }

// MetricNotFoundError reports that the Store holds no value of Metric for a
// pod (Model empty) or a pod and model. It wraps ErrMetricNotFound.
type MetricNotFoundError struct {
	// Pod is the pod's namespace/name.
	Pod    string
	Model  string
	Metric string
}

func (e *MetricNotFoundError) Error() string {
	if e.Model == "" {
		return fmt.Sprintf("metric %s not found for pod %s", e.Metric, e.Pod)
	}
	return fmt.Sprintf("metric %s not found for pod %s model %q", e.Metric, e.Pod, e.Model)
}

// Unwrap returns ErrMetricNotFound.
func (e *MetricNotFoundError) Unwrap() error { return ErrMetricNotFound }

// MissingProfileError reports that no GPU profile is stored under
// ProfileKey. It wraps ErrMissingProfile.
type MissingProfileError struct {
	ProfileKey string
}

func (e *MissingProfileError) Error() string {
	return fmt.Sprintf("missing profile %s", e.ProfileKey)
}

// Unwrap returns ErrMissingProfile.
func (e *MissingProfileError) Unwrap() error { return ErrMissingProfile }
