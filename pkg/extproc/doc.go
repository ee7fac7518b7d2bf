// Package extproc serves kvgate's routing to Envoy as an external processor
// (envoy.service.ext_proc.v3.ExternalProcessor): the endpoint picker of the
// Gateway API Inference Extension, and a drop-in for AIBrix's gateway
// plugin. Envoy opens one gRPC stream per HTTP request and sends the
// request's headers and body; the Server picks the pod with the gateway's
// Picker (the same decoding, tokenization, routing and request ledger as
// the HTTP proxy) and tells Envoy where to send the request. Envoy then
// sends the response's headers and body through the same stream, which
// drive the request's attempt in the ledger as the proxy's relay does.
//
// # The endpoint answer
//
// When the request's body is complete, the Server answers with, as the
// endpoint-picker protocol specifies:
//
//   - the request header x-gateway-destination-endpoint: <pod-ip>:<port>,
//     and AIBrix's target-pod with the same value, for an original_dst
//     cluster that reads either header;
//   - the same address under the key x-gateway-destination-endpoint in the
//     envoy.lb namespace of the dynamic metadata, for a load balancer that
//     reads metadata;
//   - the request header routing-strategy naming the algorithm, and a
//     cleared route cache, as AIBrix's plugin does (its Envoy Gateway
//     configuration routes requests with that header to its original_dst
//     cluster);
//   - the request header x-data-parallel-rank naming the data-parallel
//     rank of the pod the request is pinned to (gateway.Pick.DPRank), as
//     the proxy names it, unless the client sent the header itself, which
//     is then forwarded as it came;
//   - the body, when it changes: a streamed request that did not ask for
//     the usage chunk is forwarded asking for it, and the chunk is withheld
//     from the client, as the proxy does; a request whose model is
//     rewritten (the header x-gateway-model-name-rewrite, or an
//     InferenceModelRewrite, see gateway.HeaderModelRewrite) names the
//     model it goes to.
//
// Headers of the same names that the client sent are removed, so that a
// client cannot choose the pod. A candidate subset given in the envoy.lb.subset_hint
// metadata namespace (key x-gateway-destination-endpoint-subset, a list of
// ip:port) restricts the candidates.
//
// A request the gateway refuses is answered with an immediate response
// carrying the status and the error body the proxy would answer with
// (OpenAI-style; in Anthropic's shape to /v1/messages and
// /v1/messages/count_tokens, see gateway.Error.BodyFor): 503 when no pod
// can serve it (no ready pod, none in the subset, the gateway not ready),
// 400, 404 or 413 for the client's errors.
// With Config.FailOpen, a request refused with 503 continues without a
// destination instead (Envoy's own load balancing then applies, or its
// fail-open behaviour). GET /v1/models is answered by the Server itself,
// with the models of the ready pods and the cards their engines list, as
// the proxy answers it.
//
// # Processing modes
//
// The Server follows the message order of each of Envoy's body send modes,
// which Envoy 1.34 and later announce in the first message's
// protocol_config; without it the Server assumes BUFFERED request bodies
// and STREAMED response bodies, the modes of AIBrix's configuration.
//
//   - BUFFERED (and BUFFERED_PARTIAL) request bodies: the request headers
//     are answered at once (removing client-set destination headers and
//     setting routing-strategy); the one body message gets the endpoint
//     answer, its header mutation applied before Envoy picks the host. A
//     body that trailers end comes without end_of_stream, once the
//     trailers arrived, and the trailers follow its answer with
//     request_trailer_mode SEND. Without the announced mode, such a body
//     cannot be told from the first piece of a streamed one, and is
//     answered with 500 naming the setting.
//   - STREAMED request bodies with send_body_without_waiting_for_header_response,
//     and FULL_DUPLEX_STREAMED ones: the headers' answer waits until the
//     body is complete (its last chunk, or the trailers); then the headers
//     get the endpoint answer and every body chunk its answer, in order (in
//     FULL_DUPLEX_STREAMED the body is sent back in pieces of at most 64 KiB).
//     STREAMED without that flag, and NONE for a request with a body,
//     cannot work: Envoy picks the host before the body arrives. Such a
//     request is answered with 500 naming the setting.
//   - STREAMED request bodies have two limits. Envoy queues the pieces it
//     streams, waiting for their answers, only up to its buffer limit
//     (per_connection_buffer_limit_bytes, 1 MiB by default), then stops
//     reading the request; and it holds the request's trailers while the
//     headers' answer is pending (and never sends them with
//     request_trailer_mode SKIP, the default). The headers' answer cannot
//     come first: it carries the endpoint, and Envoy picks the host as soon
//     as it applies it. A body beyond Envoy's buffer limit, or a request
//     with trailers, thus never completes, and Envoy fails it at its
//     message_timeout as failure_mode_allow says. STREAMED suits bodies
//     within Envoy's buffer limit and requests without trailers;
//     FULL_DUPLEX_STREAMED and BUFFERED do not stall on either (Envoy
//     refuses a BUFFERED body beyond its buffer limit with 413 itself).
//   - Response headers: the response's status and content type open the
//     attempt's response, and target-pod, target-pod-name and
//     routing-strategy are added, as the proxy adds them.
//   - STREAMED, FULL_DUPLEX_STREAMED and BUFFERED response bodies: an event
//     stream is read event by event (first token, usage chunk; of an
//     Anthropic Messages stream, POST /v1/messages, its first event and its
//     message_delta's usage; of an OpenAI Responses stream, POST
//     /v1/responses, its first event after response.created and
//     response.in_progress and its response.completed's usage, and the id
//     response.created carries, which requests for the stored response
//     are picked by; as the proxy reads them); each chunk is answered with
//     the complete events it ends, so an event split over chunks leaves
//     with the chunk that completes it (an event ends only at a blank
//     line, wherever the chunks split its lines and line endings; one
//     outgrowing the bound below leaves as it comes). Other bodies pass
//     unchanged, their usage (and a Responses response's id) read with
//     their last piece. The one message of the BUFFERED modes is answered
//     whole; in BUFFERED it ends the response even without end_of_stream,
//     which then means that trailers end it.
//   - Trailers are answered unchanged. In FULL_DUPLEX_STREAMED the start
//     of an event that the last body piece left unfinished is sent before
//     them; in STREAMED it is lost, every piece having been answered
//     before the trailers come and a trailers answer carrying no body. An
//     upstream that ends each event with its blank line, as vLLM does,
//     leaves none.
//
// # Lifecycle
//
// Each stream is one request in the ledger: admitted and routed when its
// endpoint is answered, its first token reported when the first generated
// token passes, closed as done (with the usage the engine reported) when
// the response ends: with its last body chunk, its trailers, or, when Envoy
// sends no response body (response_body_mode NONE), the response headers.
// A stream that ends before the response does (the client went away, or
// Envoy reset the request) closes the attempt as cancelled. So does, in
// STREAMED response mode, a response whose upstream sends trailers that
// Envoy does not pass on (response_trailer_mode SKIP, the default): its
// last piece comes without end_of_stream and the stream then closes, as
// when the client goes away, and its usage is not read. Set
// response_trailer_mode SEND for such upstreams (FULL_DUPLEX_STREAMED
// requires it; vLLM sends no trailers). When Envoy
// reports that it could not reach the pod, through the
// response.code_details attribute of the response headers
// (response_attributes in the filter's configuration), the pod is ejected
// from routing as the proxy ejects a pod that refuses connections; a
// response served by another endpoint than the one picked
// (x-gateway-destination-endpoint-served in the envoy.lb metadata) moves
// the attempt to that pod. Every stream runs in its own goroutine and
// holds no lock while it waits: one slow or broken stream never delays
// another.
//
// # Bounds
//
// A stream holds the request's body, refused with 413 beyond the gateway's
// limit (Config.MaxRequestBodyBytes of package gateway) or beyond
// maxBodyPieces messages, and of the response only the start of an event
// that a later piece completes (at most 1 MiB; a longer event is relayed
// as it comes) and, to read its usage, the first 4 MiB of a body that is
// no event stream. gRPC messages are bounded by the body limit plus 1 MiB:
// gRPC itself refuses a buffered body beyond that before the Server reads
// it, failing the stream with RESOURCE_EXHAUSTED, and Envoy then answers
// its status_on_error (500 by default), or with failure_mode_allow
// forwards the request unrouted, rather than the 413. Envoy's buffer limit
// for a request (the listener's per_connection_buffer_limit_bytes, and a
// route's request body buffer limit where one is set) set to at most the
// body limit keeps such bodies from the Server: Envoy answers a buffered
// body beyond it with 413 itself. The streamed modes send bodies in pieces
// of Envoy's reads, far below the bound.
//
// The Server serves at most Config.MaxStreams streams at once
// (KVGATE_EXTPROC_MAX_STREAMS, 4096 by default) over all connections; a
// stream beyond them is refused at once with RESOURCE_EXHAUSTED, counted in
// kvgate_extproc_stream_errors_total{reason="too_many_streams"}, and Envoy
// applies its failure_mode_allow. One connection takes no more
// (MAX_CONCURRENT_STREAMS): Envoy opens another or waits. A stream costs a
// goroutine, its state, and the message gRPC is receiving for it: gRPC
// allocates a message's bytes as they arrive, not the length its prefix
// declares, but opens the stream's flow-control window to the whole
// message, so a stream holds at most the body limit plus 1 MiB before its
// body is charged to the gateway's held request bytes. What gRPC holds for
// messages in reception is thus at most MaxStreams times that; the windows
// cannot lower it, and what bounds it in practice is what the peer sends:
// Envoy sends a buffered body once it has buffered it.
//
// A panic while serving a stream ends that stream alone with INTERNAL (Envoy
// then applies its failure_mode_allow), cancels its request, is logged with
// its stack, and is counted in
// kvgate_extproc_stream_errors_total{reason="panic"}; the other streams and
// the process carry on.
//
// # Health
//
// The gRPC health service answers for "" (the server),
// "liveness" (SERVING while the process runs), and "readiness" and
// "envoy.service.ext_proc.v3.ExternalProcessor" (SERVING once the gateway
// knows its pods, NOT_SERVING before and once shutdown began).
//
// # Metrics
//
// New registers on the Picker's registry:
//
//	kvgate_extproc_requests_total{model,code,algorithm}     streams ended, by the response status (499: ended before a response)
//	kvgate_extproc_decision_seconds                         from the request's last message to its endpoint answer
//	kvgate_extproc_time_to_first_token_seconds{model}       from the request headers to the first generated token
//	kvgate_extproc_streams_in_flight                        streams open
//	kvgate_extproc_fail_open_total{code}                    requests continued without an endpoint (Config.FailOpen)
//	kvgate_extproc_stream_errors_total{reason}              streams ended by an error: protocol, send, misconfigured_mode, too_large, overloaded, too_many_streams, panic
//
// Tokenization failures, upstream failures and ejections are counted where
// the proxy counts them (kvgate_gateway_tokenization_failures_total,
// kvgate_gateway_upstream_failures_total, kvgate_cache_pod_ejections_total).
package extproc
