// Package gateway is kvgate's inference gateway: an OpenAI-compatible HTTP
// proxy in front of a fleet of vLLM pods that sends each request to the pod
// that can serve it fastest, using the prefix index kept by KV event sync.
//
// New builds a Gateway from a Config (LoadConfig reads one from kvgate's
// environment variables, see the configuration reference in README.md) and
// Serve runs it: the pod source (Kubernetes or a static endpoints file), the
// cache Store scraping every pod's metrics, the request ledger, the
// components keeping state in Redis, the KV event manager following every
// eligible pod's KV-cache events into the prefix index, the remote
// tokenizer and the router. The gateway is the one place that wires and
// runs these components; each runs until the context it is given ends.
// cmd/gateway is a thin main around them.
//
// # Inference
//
// POST /v1/completions and POST /v1/chat/completions take OpenAI bodies,
// POST /v1/responses OpenAI's Responses API bodies (see OpenAI Responses),
// POST /v1/messages Anthropic's Messages API bodies (see Anthropic
// Messages). For each request the gateway:
//
//  1. reads the body (413 beyond Config.MaxRequestBodyBytes; 408, and the
//     connection closed, when it takes longer than
//     Config.RequestBodyTimeout) and decodes the members it needs, by hand
//     and without decoding the others, checking the whole body's syntax as
//     encoding/json would and reading each member as vLLM does (see Request
//     members; 400 for a body that is not a JSON object, or a member vLLM
//     would refuse too);
//  2. rewrites the model the body names (see HeaderModelRewrite and
//     Config.ModelRewrites: the x-gateway-model-name-rewrite header, else
//     the InferenceModelRewrites of the pools followed), the body
//     forwarded then naming the model it goes to; resolves the routing
//     algorithm from the routing-strategy header (400
//     for an unknown name) and the model's pods from the Store (404 for a
//     model no pod serves, 503 when none of its pods is ready), leaving out
//     the pods ejected after failed connections (step 5) unless all are,
//     and the request's priority from the InferenceObjective its
//     X-Gateway-Inference-Objective header names (Config.Objectives, or the
//     inferencepool discovery's; 0 for none, an unknown one, a name that
//     is no Kubernetes object name, or when the gateway reads none), and
//     its flow among the requests of its priority from its
//     X-Gateway-Inference-Fairness-Id header (HeaderFairnessID: the
//     default flow for none, or for a value over 128 bytes or holding a
//     byte that is not printable ASCII, counted), which the SLO queues'
//     round-robin fairness has take turns (see package slo). A
//     request of a negative priority (sheddable) is refused with 429, code
//     pool_saturated and a Retry-After of 1, when no candidate pod has
//     capacity (see SaturationConfig: fresh metrics, a short enough
//     waiting queue, a KV cache not too full); the others never are;
//  3. tokenizes the prompt as the engines do (in process from the model's
//     tokenizer files once verified against the engines, otherwise vLLM's
//     /tokenize on a ready pod of the model, the pods taking turns among
//     those whose metrics are fresh and that are not ejected, a pod that
//     cannot be connected to ejected and the call made once more to
//     another; see package tokenizer) when
//     the algorithm reads it: prefix-cache, kv-aware and the SLO-aware
//     algorithms match it against the prefix index, least-latency predicts
//     the output length from its length. A failed tokenization is counted
//     by reason and the request is routed on load alone; it never waits
//     longer than the tokenizer's timeout;
//  4. admits the request to the request ledger (package inflight), routes
//     it, and opens an attempt of it on the chosen pod. An SLO-aware
//     algorithm (slo, slo-least-load, slo-least-load-pulling,
//     slo-pack-load) routes through its model's queue (package slo,
//     Config.SLO): the request carries its model's objective, from the GPU
//     profiles' SLO fields or the configuration, and goes to a pod
//     predicted to meet it. When none is, a pulling algorithm holds it in
//     the queue, highest priority first (types.RoutingContext's
//     Priority), then earliest deadline, until a pass finds one (passes
//     run on every first token, completion and scrape); slo-least-load
//     refuses it at once, and so does a pulling algorithm a sheddable
//     request (a negative priority), or one arriving while others wait. A
//     request refused (queue full, no pod could meet its objective even
//     idle, no capacity for slo-least-load, sheddable), that waited until
//     it could no longer meet its objective, or whose place in a full
//     queue a request of a higher priority took is answered 429 with a
//     Retry-After in seconds and the codes slo_queue_full, slo_unmeetable,
//     slo_no_capacity, slo_sheddable, slo_expired or slo_displaced; a client that goes
//     away leaves the queue at once; a request waiting when its model
//     leaves the fleet, or when the gateway shuts down, is answered 503.
//     With flow control (Config.FlowControl, KVGATE_FLOW_CONTROL), a
//     completion, chat, Messages or Responses request of any other
//     algorithm goes through the same queue, as the Gateway API Inference
//     Extension's flow control holds requests: on at once while a pod has
//     capacity, by SaturationConfig's rule with the attempts this gateway
//     opened on the pod since its latest scrape, still awaiting their
//     first token, counted among its engine's waiting requests (so that a
//     pod taking a burst between two scrapes stops having capacity); else
//     it waits, by priority then arrival (its deadline: its arrival plus
//     the queue's longest wait, unless its model has an objective), until
//     a pass finds a pod with capacity, and is then routed by its own
//     algorithm among all the model's pods: the gate is the pool's, so
//     that kv-aware still sends a request to the pod that holds its
//     prefix. A request that waits the longest allowed
//     (KVGATE_SLO_QUEUE_MAX_WAIT) is answered 429 pool_saturated with a
//     Retry-After; a full queue, a place taken by a higher priority and a
//     client going away are as above; a sheddable request is refused with
//     429 pool_saturated rather than queued, and one that must go to the
//     engine holding the stored response it needs is not queued. Its
//     queue shows in the kvgate_slo_* metrics and GET /debug/slo as the
//     SLO-aware algorithms' do. The attempt counts
//     as running on the pod and its prefill as queued there, until the
//     first generated token for the prefill, and until the attempt is
//     closed (done, failed, or cancelled when the client goes away) for
//     the count;
//  5. forwards the body as received to http://<pod-ip>:<serving port>
//     over the gateway's own keep-alive HTTP/1.1 connections to the pod,
//     head and body in one write, within Config.DialTimeout to connect.
//     The head carries the client's end-to-end headers: not the hop-by-hop
//     ones (Connection, Keep-Alive, Proxy-Connection, Proxy-Authenticate,
//     Proxy-Authorization, TE, Trailer, Transfer-Encoding, Upgrade and the
//     fields Connection names), Expect, Accept-Encoding (the gateway reads
//     the response, so it must come uncompressed) or Host, which names the
//     pod; Authorization as the client sent it, never the engines' key
//     (Config.Cache.EngineAPIKey), which serves the gateway's own
//     requests only; the client's X-Request-Id, or the gateway's request id when it
//     sent none; X-Data-Parallel-Rank, the client's when it sent one, else
//     the rank of a pod serving several data-parallel ranks behind its port
//     that the decision named (routing.Decision.DPRank), unless that rank
//     already runs at least 2 requests this gateway pinned to it and at
//     least twice the mean of the pod's other ranks, or the pod's latest
//     scrape shows the rank with at least 2 requests waiting and a load
//     (waiting×4 + running, plus this gateway's pins since the scrape) at
//     least twice the mean of the pod's other ranks (counted in
//     kvgate_gateway_dp_rank_requests_total; off with
//     Config.DisableDPRankRouting); and X-Forwarded-For, the addresses the
//     client's own field listed followed by the client's address, in one
//     field.
//     When the pod refuses the connection (or cannot be dialled), nothing
//     was sent: the Store ejects the pod from
//     routing for a backoff (cache.Store.EjectPod: 1 s doubling to 30 s
//     while it stays unreachable, ended early by a request or scrape that
//     reaches it), the attempt is closed as failed, and the request is
//     routed again, as a new attempt, among the candidates not tried yet
//     and not ejected meanwhile. It fails with 503 when none
//     is left. A pod that fails after the request was sent, or sends no
//     response headers within Config.FirstByteTimeout, is a 502, or a 504
//     upstream_timeout;
//  6. relays the response with the pod's status and headers, adding
//     target-pod (the pod's ip:port, as in AIBrix), target-pod-name
//     (namespace/name), routing-strategy (the algorithm used) and the
//     gateway's Server-Timing (below). A response that is not streamed is
//     read whole (up to 4 MiB) before its headers are written, so that one
//     the pod cuts short is answered with a 502 rather than relayed
//     truncated; each wait for more of a body is bounded by
//     Config.UpstreamIdleTimeout (504 when nothing was relayed yet), and
//     the whole response, from the request sent to the pod to its last
//     byte written to the client, by Config.ResponseTimeout (504 when
//     nothing was relayed yet; the pod's connection is closed, which
//     cancels the generation);
//  7. closes the attempt with the token usage of the response, which the
//     request traces and the output predictor read, or without when the
//     response reports none, and ends the request.
//
// A response that breaks off after its headers were written (the pod cut
// the connection or its framing, went quiet beyond the idle timeout, or
// went on beyond the response timeout) reaches the client
// broken, never as a response that ended well: a stream gets an error
// event in OpenAI's shape ({"error": {...}}, in an event named error on a
// Responses stream; Anthropic's for a Messages stream: see Anthropic
// Messages), an event the pod left incomplete
// dropped before it, then the connection is cut,
// so that its chunked body never ends; the attempt is closed as failed and
// counted in kvgate_gateway_upstream_failures_total by reason. A client
// that goes away ends its request's connection to the pod, which cancels
// the engine's request; the attempt is closed as cancelled and the request
// counted with status 499, never as a failure of the pod. A client that
// goes away while its request waits (for a pod, in the SLO queue, for the
// pod's first byte) is noticed within a few milliseconds (see leanhttp).
// A client that reads nothing is treated as gone once a write to it blocks
// for Config.ClientWriteTimeout: its connection is closed and counted in
// kvgate_gateway_client_write_timeouts_total. No write of a response to
// the client may pass the response timeout either, however steadily the
// client reads (only the error telling it of a failure may, within the
// write timeout): a client still being written to then has its connection
// closed, and the attempt fails as response_timeout.
// The API listener holds at most Config.MaxClientConnections client
// connections open: at the bound it accepts none until one closes, new
// connections waiting in the kernel's listen backlog, and counts the wait
// in kvgate_gateway_client_connection_limit_waits_total;
// kvgate_gateway_client_connections is how many it holds. The admin
// listener has no bound.
//
// # Other endpoints
//
// vLLM's other endpoints whose POST body names the model are proxied too,
// each request routed by that model: /v1/messages/count_tokens
// (Anthropic's token count),
// /v1/embeddings, /pooling, /classify, /score, /v1/score, /rerank,
// /v1/rerank, /v2/rerank, /tokenize, /detokenize,
// /v1/chat/completions/render and /v1/completions/render, whose bodies are
// JSON objects, and /v1/audio/transcriptions and /v1/audio/translations,
// whose bodies are multipart/form-data with the model in a field. Their
// requests take the steps above but the third: the body is read within the
// same bounds and forwarded byte for byte, only its model is read (a JSON
// string member; a form field, looked for among the form's first 64 parts
// with the boundary its Content-Type gives, read in place, the parts
// before it skipped unkept, its value at most 4 KiB), 400 when the body is
// not a JSON object or a form that can be read, or names no model, and no
// prompt is tokenized, whatever the algorithm, so that prefix-cache, kv-aware and
// least-latency route them on load alone and an SLO-aware algorithm routes
// them at once, without its model's queue (there is no prompt to predict
// their latency from; when no pod is predicted to meet the objective they
// go where kv-aware sends them). Any other method than POST is a 405. They
// count as running on their pod until their response ends, are retried on
// another pod when theirs cannot be connected to, and their responses are
// relayed as the pod sent them: a 200 event stream event by event, each
// flushed and held within Config.MaxStreamEventBytes as any stream's
// events are (see below), any other body as step 6 relays it. The gateway
// reads no usage or first token from them: they feed neither the output
// predictor, the request traces nor the TTFT metric.
// kvgate_gateway_requests_total and the duration, overhead and phase
// histograms count them with the completions of their model.
//
// The endpoints that act on one engine (/v1/load_lora_adapter,
// /v1/unload_lora_adapter, /reset_prefix_cache, /reset_mm_cache, /sleep,
// /wake_up, /collective_rpc, /start_profile, /stop_profile,
// /scale_elastic_ep, ...) are not proxied, nor is SageMaker's /invocations:
// a gateway would send them to whichever pod it picked. They answer 404;
// send them to the engine itself.
//
// A browser's CORS preflight (OPTIONS with both Origin and
// Access-Control-Request-Method) to one of the paths above, or to
// /v1/completions, /v1/chat/completions, /v1/responses, /v1/messages or
// /v1/models, names no model: it is forwarded to one ready pod of any
// model, drawn at random among those not ejected, and the engine's answer
// relayed (its status, its headers but the hop-by-hop ones, its body of at
// most 64 KiB; a longer one is a 502), so that the engines' own CORS
// policy (vLLM's --allowed-origins, --allowed-methods, --allowed-headers,
// --allow-credentials) answers it, the policy that marks their responses
// to the requests that follow, whose headers the gateway relays. vLLM's
// API-key check lets every OPTIONS request through, so the preflight,
// which browsers send without credentials, is forwarded as it came. A pod
// that cannot be connected to is ejected and the next one tried; the
// answer must come whole within Config.FirstByteTimeout (and
// Config.ResponseTimeout), else 504. No ready pod: 503 no_ready_pod.
// Preflights are counted in kvgate_gateway_requests_total under their
// endpoint with an empty model and algorithm, and not timed. Any other
// OPTIONS request is answered 405.
//
// # Anthropic Messages
//
// vLLM serves POST /v1/messages by converting the body into an OpenAI chat
// completion request and serving that chat; the gateway serves it as a
// chat, through the steps above. It reads the body's model (a string),
// max_tokens (an integer, which caps the predicted output length as a
// chat's max_tokens does) and stream (a boolean), each as vLLM reads it
// (see Request members), and refuses a body as it refuses a chat's. When
// the algorithm reads the prompt, the body is converted into the chat vLLM
// renders (tokenizer.ChatFromAnthropic) and that chat tokenized as
// /v1/chat/completions' are, its tokenizations shared with the same
// conversation sent as a chat; a body whose prompt cannot be reproduced
// exactly (images, among others) is counted in
// kvgate_gateway_tokenization_failures_total{reason="unsupported"}, one
// vLLM refuses (no max_tokens, say) under reason "input", and either is
// routed on load alone. An SLO-aware algorithm queues it as a chat. The
// body is forwarded byte for byte: vLLM streams a Messages response's
// usage whatever the client asked, so no stream_options is added. The
// response is read in Anthropic's shapes, as vLLM writes them: a stream's
// first event (message_start, which vLLM sends once the first token is
// generated; an error event excepted) is its first token, the usage of its
// message_delta event, or the top-level usage of a whole response, its
// usage (input_tokens as the prompt's tokens, output_tokens as the
// completion's); no event is withheld. /v1/messages/count_tokens
// generates nothing and is routed on load alone (see Other endpoints).
//
// The errors the gateway answers itself to /v1/messages and
// /v1/messages/count_tokens (see Errors), through the proxy and through
// the Picker's refusals (Error.BodyFor), are in Anthropic's shape, as vLLM
// answers its own there:
//
//	{"type": "error", "error": {"type": "...", "message": "..."}}
//
// the type that of the OpenAI-style error, the status and headers
// (Retry-After among them) the same, no code or param. A Messages stream
// that breaks off after its headers ends with an "event: error" event
// whose data is that object. Errors vLLM answers are relayed as it sent
// them.
//
// # OpenAI Responses
//
// vLLM serves POST /v1/responses, for models other than gpt-oss, by
// converting the body into chat messages and rendering them as a chat's;
// the gateway serves it as a chat, through the steps above. It reads the
// body's model (a string), max_output_tokens (an integer, which caps the
// predicted output length as a chat's max_tokens does) and stream (a
// boolean), each as vLLM reads it (see Request members), and refuses a
// body as it refuses a chat's, in OpenAI's shape. When the algorithm reads
// the prompt, the body is converted into the chat vLLM renders
// (tokenizer.ChatFromResponses) and that chat tokenized as
// /v1/chat/completions' are, its tokenizations shared with the same
// conversation sent as a chat; a body whose prompt cannot be reproduced
// exactly is counted in
// kvgate_gateway_tokenization_failures_total{reason="unsupported"}, one
// vLLM refuses under reason "input", and either is routed on load alone.
// (vLLM renders gpt-oss models' prompts in its harmony format, which the
// gateway does not reproduce: they match no cached prefix.) An SLO-aware
// algorithm queues it as a chat. The body is forwarded byte for byte:
// vLLM ends every Responses stream with its usage whatever the client
// asked, so no stream_options is added. The response is read in the
// Responses API's shapes, as vLLM writes them: server-sent events each
// naming its type (event: <type>), without a closing [DONE]. vLLM sends
// response.created and response.in_progress before anything is generated;
// the first event after them (an error event excepted) is the stream's
// first token. The usage is the response's that the final event carries
// (response.completed; response.incomplete or response.failed, which
// OpenAI's API also sends), or the top-level usage of a whole response:
// input_tokens as the prompt's tokens, output_tokens as the completion's,
// input_tokens_details.cached_tokens as the prompt tokens the engine found
// cached. No event is withheld. The events are held to be read up to
// Config.MaxStreamEventBytes as any stream's: response.completed carries
// the whole output (vLLM's events also echo the instructions and tools),
// so a long answer's can be longer, and is then relayed unread, its usage
// missed (see the relay of streams below). A Responses stream that breaks
// off after its headers ends with an OpenAI error object in an event named
// error ("event: error", data {"error": {...}}), which OpenAI's SDKs
// raise.
//
// # Stored responses
//
// vLLM keeps a Responses API response it stores (store true, its default;
// only with VLLM_ENABLE_RESPONSES_API_STORE=1, off by default, which vLLM
// warns leaks memory) in the memory of the API server that made it, and
// needs it for a follow-up naming it as its previous_response_id (whose
// earlier turns only that engine holds), for GET /v1/responses/{id} (the
// response, or with stream=true a background response's events) and for
// POST /v1/responses/{id}/cancel (a background response). Any other engine
// answers 404. So the gateway remembers which engine made each response it
// relays to a Responses request whose store is not false (false or null:
// vLLM keeps none), from the id of a whole response or of the event a
// stream opens with (response.created), before the client can see it: the
// pod's namespace, name, UID and address, and the model the request named.
// An id's first record stands: vLLM names a response after its request's
// request_id, which a client may set, and a later response of the same id
// must not take another client's requests elsewhere. A request for a
// response the gateway remembers goes to that engine, whatever the routing
// algorithm, even when the engine is ejected, and is neither tokenized nor
// held in an SLO queue: a follow-up's prompt cannot be reproduced (the
// queue predicts from it), and the engine holds its prefix. A follow-up
// whose response the gateway does not remember, or whose engine no longer
// is a ready pod of the model (deleted, replaced by a pod of another UID or
// address, whose store is empty, or not ready), is routed on load alone
// (its tokenization counted as unsupported), and the engine it reaches
// answers 404 unless it holds the response. GET /v1/responses/{id} and POST
// /v1/responses/{id}/cancel, which name no model, are answered 404
// not_found by the gateway itself in those cases, saying why; through the
// external processor alike. Each gateway replica remembers the responses it
// relayed, up to Config.MaxStoredResponses (KVGATE_MAX_STORED_RESPONSES,
// 100,000, about 200 bytes each), the oldest forgotten first. With Redis
// (Config.Redis.StoredResponses, KVGATE_SHARED_STORED_RESPONSES, on by
// default with Redis), the replicas share these records, so that behind a
// load balancer a client's follow-ups reach the engine that made the
// response through any replica: each replica writes its records to Redis in
// the background (key kvgate:stored_response:<id>, expiring after
// KVGATE_STORED_RESPONSE_TTL_SECONDS, an hour, the first record of an id
// standing there too; see package redisstate), and a replica with no record
// of a response a request names asks Redis, waiting at most
// KVGATE_STORED_RESPONSE_LOOKUP_TIMEOUT_MS (50 ms), and remembers what it
// finds, so that it asks once per response. Only requests naming a response
// ask: a follow-up, GET or cancel. Requests naming one response at once
// share one look-up, the later ones waiting for its answer within the same
// timeout ({result="coalesced"}), and at most 64 look-ups per replica wait
// for Redis at once (redisstate.DefaultStoredResponseLookups): one that
// finds 64 waiting does not ask, nor wait ({result="busy"}), so that
// requests naming responses no replica recorded do not drive Redis's load
// with their rate. A look-up that finds nothing, a record longer than 1 KiB
// or malformed (ignored), that times out or fails (Redis unreachable), or
// that finds the bound reached is counted in
// kvgate_cache_stored_response_lookups_total{result}, and the request is
// served as one for a response the gateway has no record of. A record is
// written within moments of the response's id reaching the client, not
// before: a follow-up sent at once through another replica may miss it, and
// one sent after the TTL finds it only through the replica that relayed the
// response. Without Redis, a client's follow-ups reach the engine that made
// the response when they come through the same replica (session affinity on
// the load balancer). Engines without the store answer every such request
// 404 as they would directly.
//
// # Request members
//
// The gateway reads these members of a completion or chat request (of a
// Messages request: model, max_tokens and stream, read alike; of a
// Responses request: model, max_output_tokens and stream alike,
// previous_response_id, a string or null, and store, a boolean or null;
// see Stored responses), and forwards the body as the client wrote it (but
// for stream_options, below):
//
//   - model (both endpoints), chat_template, truncation_side and
//     reasoning_effort (chat): a string, or null;
//   - prompt (completions), messages, tools, documents,
//     chat_template_kwargs, mm_processor_kwargs and media_io_kwargs
//     (chat): any JSON value, passed to the tokenizer as written;
//   - max_tokens, truncate_prompt_tokens (both) and max_completion_tokens
//     (chat): an integer;
//   - stream, add_special_tokens (both), add_generation_prompt and
//     continue_final_message (chat): a boolean;
//   - stream_options: an object whose include_usage and
//     continuous_usage_stats are booleans; an absent include_usage reads
//     as true, vLLM's default, so {"stream_options": {}} asks for usage,
//     and a null one as false.
//
// vLLM validates requests with pydantic in its default (lax) mode, and the
// gateway reads integers and booleans as it does, so that a client that
// works against vLLM works through the gateway, and the gateway acts on
// the value the engine will: an integer may also be a number whose value
// is whole (100.0, 1e3), a string holding an integer (with white space, a
// + sign, leading zeros, underscores between digits or a fraction of
// zeros: " 1_000.0 "), or true or false (1 and 0); one beyond the range of
// int reads as the nearest int, one of more than 4,300 digits is refused,
// as Python refuses it. A boolean may also be 0 or 1 (1.0 too), or one of
// the strings "0", "1", "f", "n", "no", "off", "false", "t", "y", "on",
// "yes" and "true" in any case. null reads as the member being absent. So
// {"stream": "true"} is streamed, and asked for the usage chunk as any
// stream is, and {"max_tokens": "100"} predicts 100 tokens. A member of
// another type (a string that is none of these, a fraction, an array, an
// object) is refused with 400 (invalid_json), naming the member: vLLM
// refuses it too, and the gateway never routes on a reading the engine
// would not make.
//
// # Server-Timing
//
// The gateway times each request from the first byte of it read to the
// last byte of its response written, in phases that follow each other:
// read (the request read, decoded and checked), tokenize, route (choosing
// the pod and sending it the request, retries included), upstream (the
// wait for the pod's response headers) and relay (to the response's last
// byte). Each response carries them in a Server-Timing header value after
// the pod's own, in milliseconds, led by the gateway's own time, the
// whole so far less the wait for the pod:
//
//	Server-Timing: gateway;dur=0.210, read;dur=0.020, tokenize;dur=0.001, route;dur=0.015, upstream;dur=4.800, relay;dur=0.050
//
// The header of a response that is not streamed is written once its body
// was read, so its relay covers all but writing it; a streamed response's
// header covers the phases up to it, and its trailer (declared in
// Trailer: Server-Timing) adds the relay, which includes the engine's
// generation, and the total: "relay;dur=812.400, total;dur=817.250". A
// body longer than 4 MiB is relayed as it comes, and its relay is not in
// its header. kvgate_gateway_request_phase_seconds{phase} observes every
// phase, kvgate_gateway_request_duration_seconds the whole and
// kvgate_gateway_overhead_seconds the time to sending the request to its
// first pod.
//
// Streams are relayed as server-sent events, event by event as the pod
// sends them, flushed whenever the gateway has relayed all it received, and
// byte for byte. The headers go out as soon as the pod's do, or with the
// first event when it came with them; the last events go out with the end
// of the response, in one write. To learn a stream's usage, the gateway asks the pod for the
// usage chunk (stream_options.include_usage) when the client did not (its
// stream_options, as vLLM reads them, leave usage off: see Request
// members), and
// withholds that chunk (the chunk with an empty choices list and a usage
// object) from the client, which receives exactly what it would have
// received from the pod directly. The body of such a request is forwarded
// with "stream_options":{"include_usage":true} inserted as its first member;
// a body that has stream_options is re-encoded with include_usage set (and
// continuous_usage_stats off). A stream's first token is the first event
// with generated output (text, a chat delta other than the opening role, or
// a finish reason; of a Messages stream, its first event; of a Responses
// stream, its first event after response.created and
// response.in_progress): it ends the
// request's prefill for routing and is the time to first token the gateway
// observes.
//
// To read a stream's events, the gateway holds each whole, up to
// Config.MaxStreamEventBytes (KVGATE_MAX_STREAM_EVENT_BYTES, 1 MiB). Once
// an event holds more, what was held is relayed and the rest of the event
// is relayed as it comes, unread, to the blank line that ends it; the
// events after it are read again. What the gateway holds of a stream stays
// within the bound (and a read of 64 KiB), an event without end is bound in
// time by the idle and response timeouts, and the client still receives
// every byte the pod sent. A first token or usage an oversized event
// carries is missed (the time to first token is then taken at a later
// event, and a response without usage is counted in
// kvgate_gateway_responses_without_usage_total), and a usage chunk the
// gateway asked for on the client's behalf reaches the client, as it cannot
// be told apart unread. Each such event is counted in
// kvgate_gateway_oversized_events_total and logged at verbosity 2 with
// the request's model and pod.
//
// A request's model may name a LoRA adapter rather than a base model. The
// pods serving an adapter are those declaring it (the kvgate.io/lora-adapters
// annotation, loraAdapters in the endpoints file) and those whose engine
// lists it on GET /v1/models, which the Store reads from every ready pod
// every KVGATE_ADAPTER_REFRESH_INTERVAL, so adapters loaded at runtime
// become routable without configuration. An adapter request is tokenized by
// one of those pods (naming the adapter), routed among them only, and
// matched in the prefix index under the pods' base model and the adapter's
// name: vLLM salts an adapter's block hashes with its name and names it in
// its KV events, so blocks computed with the adapter match requests for it
// and never requests for the base model or another adapter.
//
// GET /v1/models lists the models with at least one ready pod, adapters
// included, sorted, each with the model card its engines list, in vLLM's
// shape: {"object":"list","data":[{"id", "object":"model", "created",
// "owned_by", "root", "parent", "max_model_len", "permission"}]}. root
// (the model's path or Hugging Face name, an adapter's path), parent (an
// adapter's base model, null for a base model) and owned_by are those of
// the card the first of the model's ready pods (by namespace and name)
// lists; max_model_len is the smallest any of them lists, since a request
// may be routed to any of them; created is when the gateway started, and
// permission vLLM's default. Until an engine's listing is read (at
// KVGATE_ADAPTER_REFRESH_INTERVAL, never when it is 0), a model's card has
// root = its id, parent = its base model for an adapter (null otherwise),
// max_model_len null and owned_by "kvgate". The Store keeps the cards of a
// pod's base model and of the adapters it takes from the pod, each root,
// parent and owned_by of at most 1 KiB (a longer one is dropped, showing
// the fallback).
//
// Errors the gateway answers itself are OpenAI-style JSON (in Anthropic's
// shape, with the same types, to Anthropic's Messages endpoints: see
// Anthropic Messages):
//
//	{"error": {"message": "...", "type": "...", "param": "model" or null, "code": "..."}}
//
// with these types and codes:
//
//	400 invalid_request_error     invalid_json, unreadable_body, missing_field, invalid_field, unknown_routing_strategy, tokenizer_disabled
//	404 invalid_request_error     model_not_found
//	404 not_found_error           not_found (no such endpoint, an engine's own endpoint, a stored response)
//	405 invalid_request_error     method_not_allowed
//	408 invalid_request_error     request_timeout (the body did not arrive in time; the connection is closed)
//	413 invalid_request_error     request_too_large
//	429 rate_limit_error          too_many_requests (POST /debug/match only)
//	502 upstream_error            upstream_failed (the pod failed after the request was sent, or cut its response)
//	503 service_unavailable_error no_ready_pod, pods_unreachable, gateway_not_ready (the pods are not known yet)
//	504 upstream_error            upstream_timeout (no response headers, no more of the body, or not the whole body, in time)
//
// Errors a pod answers with are relayed as the pod sent them.
//
// # Other front ends
//
// A front end that forwards requests itself, such as an Envoy external
// processor (package extproc), decides with the gateway's Picker: Pick runs
// steps 1 to 4 on a request's path, body and routing-strategy header (a
// request to another path than the two above is routed by the model its
// JSON body names, on load alone) and refuses with the status and error the
// proxy would answer with; a request naming an SLO-aware algorithm waits in
// its model's queue for as long as the context Pick is given lasts, and a
// refusal's Error carries its Retry-After. The Pick it returns names the
// pod and the body to forward, and takes what becomes of the request
// (Response with its body's pieces, Unreachable, Served, Fail, Cancel,
// End), driving the request ledger as steps 5 to 7 do. Attach makes Serve run such a front
// end (a Frontend) on a listener of its own, from the start until the
// shutdown, when it drains with the API's listener.
//
// # Listeners
//
// Everything is served on Config.ListenAddress unless Config.AdminListenAddress
// (KVGATE_ADMIN_LISTEN_ADDRESS, --admin-listen-address) is set: /metrics and
// /debug/* are then served on the admin address only, where the API's
// clients need no access (none of the endpoints authenticate), and answer
// 404 on the API's listener; /healthz and /readyz answer on both. The
// admin listener also serves Go's profiles (net/http/pprof) under
// /debug/pprof/, e.g. "go tool pprof http://127.0.0.1:9090/debug/pprof/profile?seconds=20";
// without an admin address no listener serves them. With
// Config.DisableProxy (KVGATE_PROXY_ENABLED=false) the OpenAI endpoints
// answer 404: requests come through an attached front end only. On
// shutdown both fail /readyz, and the admin listener closes after the
// API's requests have drained, so that metrics can be read meanwhile.
//
// The API's listener reads the inference requests (POST
// /v1/completions and /v1/chat/completions over HTTP/1.1 with a plain
// Content-Length body) itself, through pkg/leanhttp, which costs less per
// request than net/http's server; it hands every other request, and the
// rest of its connection, to net/http's server before reading any of it.
//
// # Health
//
// GET /healthz answers 200 while the process runs. GET /readyz answers 200
// once the pod source has delivered the pods (and, with KV event sync, the
// KV event manager has started), and 503 before and once shutdown has
// begun; the body says why in one line. On shutdown the gateway goes on
// serving, /readyz answering 503, for Config.ShutdownDelay
// (KVGATE_SHUTDOWN_DELAY, 5 s by default) before it stops accepting
// connections, so that load balancers see the drain rather than refused
// connections. Meanwhile every response of the API listener carries
// Connection: close, and its connection closes once it is sent: a
// keep-alive client opens a new connection for its next request, which
// goes to another gateway, rather than send it on a connection the end of
// the delay would cut. GET /metrics serves every metric of
// the process from one registry: the gateway's, the Store's, the index's,
// the KV event manager's and its clients', the tokenizer's, the router's,
// Go's and the process's.
//
// # Debug API
//
// GET /debug/kvcache shows, per model, what the prefix index holds and how
// the KV event streams feeding it are doing:
//
//	{
//	  "kvEventSync": true,
//	  "models": [{
//	    "model": "llama", "blockSize": 16, "entries": 5120,
//	    "pods": [{
//	      "pod": "static/vllm-0",
//	      "state": "followed",            // followed, ineligible or failed; "" once the manager forgot the pod
//	      "reason": "...", "error": "...", // why a pod is ineligible or failed
//	      "blocks": {"GPU": 4096, "CPU": 1024},  // resident blocks of group 0, all ranks
//	      "lastMatch": "2026-11-02T10:04:05Z",   // last time routing credited the pod
//	      "liveness": {"state": "live",          // dead: no stream connected, no scrape for the dead-pod timeout
//	                   "lastScrapeAgeSeconds": 0.02},  // eventsDownSeconds, deadForSeconds when they apply
//	      "ranks": [{
//	        "rank": 0,
//	        "lanes": [{"medium": "GPU", "group": 0, "blocks": 4096}],
//	        "lastEventAgeSeconds": 0.8,          // since the index applied the stream's last batch
//	        "client": {
//	          "pubEndpoint": "tcp://10.0.0.5:5557", "replayEndpoint": "tcp://10.0.0.5:5558",
//	          "topic": "", "publisherTopic": "",  // the engine's, once a replay reply named it (vLLM >= v0.26)
//	          "since": "2026-11-02T10:00:00Z", "connected": true, "lastSeq": 1234,
//	          "batches": 1235, "replayedBatches": 12, "replayFailures": 0,
//	          "unrecoverableGaps": 0, "missedBatches": 0, "publisherRestarts": 0, "decodeErrors": 0,
//	          "topicMismatch": false           // batches arrive only through replay: the topic filters out live ones
//	        }
//	      }]
//	    }]
//	  }]
//	}
//
// POST /debug/match takes {"model", "lora" (optional adapter), and one of
// "prompt" (a string or token ids, tokenized as a completion), "messages"
// (tokenized as a chat) or "tokens" (token ids)} and shows how each ready
// pod that is not ejected matches the prompt and what every algorithm would
// decide now, without routing anything:
//
//	{
//	  "model": "llama", "lora": "",
//	  "promptTokens": 352, "tokenSource": "tokenizer",  // tokens, tokenizer, or none with tokenizeError
//	  "blockSize": 16, "promptBlocks": 22,
//	  "pods": [{"pod": "static/vllm-0", "matchedBlocks": 22, "matchedGPUBlocks": 22,
//	            "matchedTokens": 352, "matchedGPUTokens": 352}],
//	  "ejected": [{"pod": "static/vllm-1", "reason": "connection_refused",  // left out of the decisions
//	               "ejections": 1, "backoffSeconds": 1, "remainingSeconds": 0.4}],
//	  "defaultAlgorithm": "kv-aware",
//	  "decisions": [routing.Decision, ...]  // one per algorithm, see routing.Explanation
//	}
//
// /debug/match is bounded: a body beyond 8 MiB or a prompt beyond 1Mi
// tokens is refused with 413, and beyond two requests served at once
// others are answered 429 with Retry-After
// (kvgate_gateway_debug_match_refusals_total{reason}).
//
// GET /debug/slo shows each model's objective, where it comes from
// (profile, model, default or none), and its queue: bounds, last pass and
// the waiting requests in the order passes try them (highest priority
// first, then earliest deadline) with their priorities, waits and
// deadlines, and the client's X-Request-Id beside the gateway's id when it sent one
// (see Request ids):
//
//	{"models": [{"model": "llama", "slo": "ttft:2s", "source": "model",
//	  "queue": {"model": "llama", "length": 1, "maxLength": 1024, "maxWaitSeconds": 60,
//	            "waiting": [{"requestID": "kvgate-05d6e9fa-7", "priority": 0, "clientRequestID": "app-42", "promptTokens": 352,
//	                         "waitedSeconds": 0.4,
//	                         "deadlineInSeconds": 1.6, "leavesInSeconds": 1.1, "slo": "ttft:2s",
//	                         "tries": 3, "drainEstimateSeconds": 0.9}]}}]}
//
// GET /debug/responses/{id} shows the gateway's record of a Responses API
// response (see Stored responses), and 404 when it has none: the engine
// that made it, the model its request named, and whether requests for it
// reach that engine now (result owner) or it no longer serves the model
// (gone):
//
//	{"id": "resp_6f0d...", "pod": "default/llama-0", "uid": "2c1e...", "address": "10.0.0.7:8000",
//	 "model": "llama", "result": "owner"}
//
// # Request ids
//
// Each request gets an id of the gateway's own, unique in its process
// ("kvgate-<process>-<n>"), which its logs, GET /debug/slo and the request
// ledger use: a client never chooses it, lest two clients' requests
// collide. The engine is sent the client's X-Request-Id, which vLLM names
// the request after, or the gateway's id when the client sent none. The
// client's id is shown beside the gateway's, as clientRequestID, in the
// per-request logs (the proxy's, the external processor's and routing's, at
// verbosity 2 and up) and in GET /debug/slo, to join them with the
// engine's logs: its first 128 bytes (types.MaxLoggedClientRequestIDBytes),
// each byte that is not printable ASCII replaced with '?'. Behind Envoy,
// the external processor shows the x-request-id Envoy sets or passes on,
// which is the id the engine receives (PickRequest.ClientRequestID).
//
// # Metrics
//
//	kvgate_gateway_requests_total{model,code,algorithm}   inference requests answered (code 499: the client went away)
//	kvgate_gateway_request_duration_seconds{model}        first byte read to last byte written
//	kvgate_gateway_request_phase_seconds{phase}           each phase of that time: read, tokenize, route, upstream, relay
//	kvgate_gateway_overhead_seconds                       first byte read to sending to a pod (read, tokenize, route)
//	kvgate_gateway_time_to_first_token_seconds{model}     first byte read to the first token relayed, streams
//	kvgate_gateway_requests_in_flight                     requests being served
//	kvgate_gateway_retries_total{reason}                  requests sent to another pod: connection_refused, dial
//	kvgate_gateway_upstream_failures_total{reason}        connection_refused, dial, send, first_byte_timeout, body, idle_timeout, response_timeout
//	kvgate_gateway_oversized_events_total                 stream events beyond Config.MaxStreamEventBytes, relayed unread
//	kvgate_gateway_tokenization_failures_total{reason}    requests routed without tokens, by tokenizer.Reason (unsupported: a Messages or Responses prompt not reproducible)
//	kvgate_gateway_responses_without_usage_total          successes whose usage could not be read
//	kvgate_gateway_request_body_timeouts_total            bodies that did not arrive within the body timeout (408)
//	kvgate_gateway_debug_match_refusals_total{reason}     /debug/match requests refused: busy, too_large
//	kvgate_gateway_stored_responses                       Responses API responses whose engine is remembered
//	kvgate_gateway_stored_responses_total{event}          of those: recorded, evicted (beyond the bound), refused (id empty or too long)
//	kvgate_gateway_stored_response_requests_total{endpoint,result}  requests needing one: owner, gone, unknown
//
// The model label is empty for requests rejected before their model was
// found, and the algorithm label for requests rejected before it was
// resolved, so that clients cannot grow the label sets. Ejections are
// counted by the Store: kvgate_cache_pod_ejections_total{pod,reason} and
// kvgate_cache_ejected_pods; the SLO queues by package slo
// (kvgate_slo_*).
package gateway
