package extproc

import (
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvgate/kvgate/pkg/gateway"
	"github.com/kvgate/kvgate/pkg/routing"
)

// Names of the endpoint-picker protocol of the Gateway API Inference
// Extension.
const (
	// HeaderDestination is the request header, and the key in the
	// MetadataNamespace of the dynamic metadata, naming the endpoint
	// (ip:port) the request goes to.
	HeaderDestination = "x-gateway-destination-endpoint"
	// MetadataNamespace is the dynamic metadata namespace of the endpoint
	// answer and of the served endpoint Envoy reports.
	MetadataNamespace = "envoy.lb"
	// KeyServed is the key, in MetadataNamespace of a response's metadata
	// context, of the endpoint that served the request.
	KeyServed = "x-gateway-destination-endpoint-served"
	// SubsetNamespace and KeySubset locate, in a request's metadata context,
	// the list of endpoints the pick must come from.
	SubsetNamespace = "envoy.lb.subset_hint"
	KeySubset       = "x-gateway-destination-endpoint-subset"
	// AttributeCodeDetails is the Envoy attribute that says why Envoy
	// answered a request itself (response.code_details), read from the
	// response headers' attributes.
	AttributeCodeDetails = "response.code_details"
)

// maxBodyPiece bounds the pieces of a body sent back in
// FULL_DUPLEX_STREAMED mode, as Envoy recommends.
const maxBodyPiece = 64 << 10

// maxBodyPieces bounds the messages a request body may come in when the
// headers' answer waits for it, each answered once the body is complete: a
// body in more pieces is refused with 413, counted as too_large. Envoy
// sends a piece per buffer it reads, far fewer.
const maxBodyPieces = 1 << 16

// headerValue returns the value of a header Envoy sent: raw_value, or
// value for Envoys that send that.
func headerValue(h *corev3.HeaderValue) string {
	if len(h.GetRawValue()) > 0 {
		return string(h.GetRawValue())
	}
	return h.GetValue()
}

// requestHeaders is what the Server reads of a request's headers.
type requestHeaders struct {
	method, path, strategy string
	// requestID is x-request-id, which Envoy sets or passes on, the first
	// when there are several.
	requestID string
	// namesRank reports the client's own x-data-parallel-rank.
	namesRank bool
	// contentType tells how a body names its model (see
	// gateway.PickRequest.ContentType).
	contentType string
	// objective is x-gateway-inference-objective, "" for none.
	objective string
	// fairnessID is x-gateway-inference-fairness-id, "" for none.
	fairnessID string
	// modelRewrite is x-gateway-model-name-rewrite (see
	// gateway.PickRequest.ModelRewrite).
	modelRewrite string
	// hasLength reports a content-length header.
	hasLength bool
}

func readRequestHeaders(m *corev3.HeaderMap) requestHeaders {
	var r requestHeaders
	for _, h := range m.GetHeaders() {
		switch strings.ToLower(h.GetKey()) {
		case ":method":
			r.method = headerValue(h)
		case ":path":
			r.path = headerValue(h)
		case routing.HeaderRoutingStrategy:
			r.strategy = strings.TrimSpace(headerValue(h))
		case "x-request-id":
			if r.requestID == "" {
				r.requestID = headerValue(h)
			}
		case "content-type":
			r.contentType = headerValue(h)
		case headerDPRank:
			r.namesRank = true
		case headerObjective:
			r.objective = headerValue(h)
		case headerFairnessID:
			r.fairnessID = headerValue(h)
		case gateway.HeaderModelRewrite:
			r.modelRewrite = strings.TrimSpace(headerValue(h))
		case "content-length":
			r.hasLength = true
		}
	}
	return r
}

// headerDPRank is gateway.HeaderDataParallelRank as Envoy names headers.
var headerDPRank = strings.ToLower(gateway.HeaderDataParallelRank)

// headerObjective is gateway.HeaderInferenceObjective as Envoy names
// headers.
var headerObjective = strings.ToLower(gateway.HeaderInferenceObjective)

// headerFairnessID is gateway.HeaderFairnessID as Envoy names headers.
var headerFairnessID = strings.ToLower(gateway.HeaderFairnessID)

// responseHeaders is what the Server reads of a response's headers.
type responseHeaders struct {
	status                     int
	contentType, contentLength string
}

func readResponseHeaders(m *corev3.HeaderMap) responseHeaders {
	var r responseHeaders
	for _, h := range m.GetHeaders() {
		switch strings.ToLower(h.GetKey()) {
		case ":status":
			r.status, _ = strconv.Atoi(headerValue(h))
		case "content-type":
			r.contentType = headerValue(h)
		case "content-length":
			r.contentLength = headerValue(h)
		}
	}
	return r
}

// subset returns the endpoints a request's metadata restricts the pick to,
// nil when it names none.
func subset(md *corev3.Metadata) []string {
	ns, ok := md.GetFilterMetadata()[SubsetNamespace]
	if !ok {
		return nil
	}
	v, ok := ns.GetFields()[KeySubset]
	if !ok {
		return nil
	}
	out := []string{}
	for _, e := range v.GetListValue().GetValues() {
		if s := e.GetStringValue(); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// served returns the endpoint a response's metadata says served the
// request, "" when it does not say.
func served(md *corev3.Metadata) string {
	return md.GetFilterMetadata()[MetadataNamespace].GetFields()[KeyServed].GetStringValue()
}

// codeDetails returns the response.code_details attribute of a message, ""
// when Envoy sent none.
func codeDetails(req *extprocv3.ProcessingRequest) string {
	for _, attrs := range req.GetAttributes() {
		if v, ok := attrs.GetFields()[AttributeCodeDetails]; ok {
			return v.GetStringValue()
		}
	}
	return ""
}

// set is a header mutation setting key to value, replacing any value.
func set(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: key, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// destinationHeaders are the request headers that name the pod, which a
// client may not set.
var destinationHeaders = []string{HeaderDestination, gateway.HeaderTargetPod}

// endpointMetadata is the dynamic metadata naming the endpoint address.
func endpointMetadata(address string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		MetadataNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			HeaderDestination: structpb.NewStringValue(address),
		}}),
	}}
}

// immediate is an immediate response with status, a JSON body and details
// for Envoy's access log.
func immediate(status int, body []byte, details string) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode(status)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				set("content-type", "application/json"),
			}},
			Body:    body,
			Details: details,
		},
	}}
}

// requestHeadersResponse answers the request headers.
func requestHeadersResponse(c *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: c},
	}}
}

// requestBodyResponse answers a request body message.
func requestBodyResponse(c *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
		RequestBody: &extprocv3.BodyResponse{Response: c},
	}}
}

// responseHeadersResponse answers the response headers.
func responseHeadersResponse(c *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{Response: c},
	}}
}

// responseBodyResponse answers a response body message.
func responseBodyResponse(c *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
		ResponseBody: &extprocv3.BodyResponse{Response: c},
	}}
}

// streamedBody is a body mutation carrying a piece of the body in
// FULL_DUPLEX_STREAMED mode.
func streamedBody(piece []byte, end bool) *extprocv3.CommonResponse {
	return &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: piece, EndOfStream: end}},
	}}
}

// replaceBody is a body mutation replacing the piece answered, clearing it
// when body is empty.
func replaceBody(body []byte) *extprocv3.CommonResponse {
	if len(body) == 0 {
		return &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_ClearBody{ClearBody: true}}}
	}
	return &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: body}}}
}

// trailersResponse answers request or response trailers, unchanged.
func trailersResponse(response bool) *extprocv3.ProcessingResponse {
	if response {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocv3.TrailersResponse{},
		}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
		RequestTrailers: &extprocv3.TrailersResponse{},
	}}
}
