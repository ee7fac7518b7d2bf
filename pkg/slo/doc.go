// Package slo holds requests that no pod can serve within their
// service-level objective (SLO) until one can: the per-model queues of the
// SLO-aware routing algorithms (slo, slo-least-load, slo-least-load-pulling
// and slo-pack-load, see package routing), after AIBrix's QueueRouter.
//
// # Objectives
//
// A model's objective (types.SLO: time to first token, optionally growing
// with the prompt's length, mean time per output token, end-to-end latency)
// comes from the SLO fields of the GPU profiles of the deployments serving
// it where they set one, the strictest when they differ, and from the
// configuration otherwise (Config, Objectives), target by target. A request
// carries its model's objective in its routing context, counted from its
// arrival at the gateway.
//
// # The queue
//
// A QueueRouter is one model's queue. A request arriving when none waits
// is routed at once if a pod is predicted to meet its SLO; otherwise, with
// a pulling algorithm, it waits, highest priority first, then earliest
// deadline (see Priorities, DeadlineOf), and passes over the queue
// (Dispatch) route each waiting request as soon as a pod is predicted to
// meet its SLO: on a first token, a completion, a scrape of the pods'
// metrics, an arrival (see Routers.Trigger). A request leaves the queue
// without a pod when it can no longer meet its SLO even on the best pod
// once that pod's queue has drained, after Config.MaxWait, when its model
// leaves the fleet, or when a request of a higher priority takes its place
// in a full queue; one arriving at a full queue (Config.MaxQueueLength)
// that outranks no waiting request, or that no pod could serve within its
// SLO even idle, is refused at once. Front ends answer both with 429 and a
// Retry-After (*Error: whole seconds, at most Config.MaxWait), except a
// request whose model left, or that no pod is left to route to
// (Entry.Try's own error), with 503. A front end waits on a request with
// its own context (QueueRouter.Route): a client that goes away leaves the
// queue at once. The queue never routes by itself: each request brings
// the function that routes it (Entry.Try), which the HTTP proxy, an Envoy
// external processor and the routing benchmark's simulation each write
// their own way, one decision at a time per model so that each sees the
// load the previous one added.
//
// A request of slo-least-load, which never waits (Route without hold), is
// tried at once even while requests of its model wait: it cannot queue
// behind them, and refusing it while a pod can serve it within its SLO
// would turn away work the fleet has room for (AIBrix's slo-least-load
// pushes the same way). It may so take capacity that freed for an
// earlier waiting request, before the pass the freeing triggered gives it
// to that request. The pulling algorithms keep the queue's order among
// themselves: a request arriving while others wait queues behind those of
// a higher priority and those of its own due earlier.
//
// A pass tries the waiting requests in the queue's order; after
// maxWaitsPerPass requests in a row that no pod can take, it stops trying
// and only lets go of those that can no longer meet their SLO, so that a
// pass over a long queue on a full fleet costs a few decisions.
//
// # Priorities
//
// A request's priority (types.RoutingContext's Priority, from the Gateway
// API Inference Extension's InferenceObjective it names) orders the queue
// before its deadline: a pass tries every waiting request of a higher
// priority before any of a lower one, whenever they arrived, and requests
// of equal priority (all of them, by default: 0) earliest deadline first.
// A request no pod can take yet does not hold up those after it, so one of
// a lower priority that needs less may still be routed while one of a
// higher priority waits.
//
// A full queue makes room for a request of a higher priority than one
// waiting: the waiting request of the lowest priority, and among those
// the latest deadline, leaves with ReasonDisplaced (429, with the
// Retry-After of a full queue) and the arrival waits in its place. An
// arrival that outranks no waiting request is refused (ReasonQueueFull):
// the queue never holds more than Config.MaxQueueLength. (With
// FairnessRoundRobin, the flows of the lowest priority count too: see
// Fairness.)
//
// A sheddable request (a negative priority) never waits: where a pulling
// algorithm would queue it, because no pod can take it within its SLO or
// requests of its model already wait (it is then not even tried), it is
// refused with ReasonSheddable (429, with a Retry-After of when a pod is
// estimated to free up), as the Gateway API Inference Extension rejects
// sheddable requests when its pool is saturated. One a pod can take at
// once is routed like any other; slo-least-load, which never queues,
// refuses it for want of capacity as it does any request
// (ReasonNoCapacity).
//
// # Fairness
//
// A request may belong to a flow (types.RoutingContext's FairnessID: the
// Gateway API Inference Extension's x-gateway-inference-fairness-id
// header, e.g. a tenant); requests that name none share one default flow.
// How a queue orders the requests of one priority that belong to
// different flows is its fairness policy (Config.Fairness). With
// FairnessDeadline, the default, flows play no part: earliest deadline
// first, as above, so a flow that floods the queue with requests of
// earlier deadlines goes before every other. With FairnessRoundRobin, as
// the Inference Extension's flow control has a priority band's flows take
// turns, a pass tries one request of each flow waiting at that priority,
// then a second of each, and so on, each flow's own requests earliest
// deadline first; the turns go in the order of the flows' ids and start
// with the flow after the one whose request the queue last routed at that
// priority (before any was, with the flow of the earliest deadline), so
// that over successive passes every flow with requests waiting is served
// in turn. Priorities still come first, and a pass's bound and restarts
// are those of the queue's order. A full queue then makes room from the
// flow with the most requests waiting at the lowest priority: its request
// of the latest deadline leaves (ReasonDisplaced) for an arrival of a
// higher priority, or of that priority and a flow with at least two
// fewer of its requests waiting; any other arrival of that priority is
// refused (ReasonQueueFull), so that a flooding flow gives up its own
// places rather than another's, and flows one request apart do not trade
// places at the cost of a request that waited.
//
// A queue keeps a flow only while it has requests waiting, and, for each
// priority with requests waiting, the flow last routed at it: nothing
// grows with the flows that come and go. With a single flow waiting at
// each priority, a pass costs what it costs with FairnessDeadline.
//
// # Metrics
//
// NewMetrics registers, per model:
//
//	kvgate_slo_queue_length{model}            requests waiting
//	kvgate_slo_queue_wait_seconds{model}      time waited, by requests leaving the queue
//	kvgate_slo_requests_total{model,outcome}  admitted, rejected, expired, cancelled, dropped, displaced, shed
//	kvgate_slo_queued_total{model}            requests that had to wait
//
// A model's series are deleted when it leaves the fleet.
package slo
