// Package inflight is the ledger of the inference requests the gateway has
// in flight: one record per request, one handle per attempt to serve it on
// a pod, and what every consumer reads of them.
//
// # Lifecycle
//
// A front end (the gateway's HTTP proxy, or an Envoy external processor
// that sees the same request as a sequence of messages) drives each
// request through four operations, in this order:
//
//  1. Ledger.Admit when the request arrives: it counts as queued for its
//     model until it is routed.
//  2. Request.Route when it is routed to a pod P with N prompt tokens: it
//     opens the attempt's Handle, which counts as running on P, and its
//     prefill as work queued on P until the first token.
//  3. Handle.FirstToken when the first generated token comes back, and
//     Handle.ReportUsage when the engine reports the token usage.
//  4. Handle.Close exactly once, when the attempt is done, failed or
//     cancelled; Request.End when the request is over.
//
// A retry closes the failed attempt's handle and routes the request again,
// opening a new one; the request itself, as traces count it, is one. A
// handle closed twice, or a request ended twice, changes nothing the second
// time (the ignored closes are counted). A request admitted and not ended
// within Config.TTL is reaped: its attempt is closed as Expired and the
// request ended, counted in kvgate_cache_requests_expired_total; the TTL
// bounds what a lost end costs, and is the ledger's only timeout.
//
// # What the ledger keeps
//
// Per pod, a PodLoad: the attempts running on the pod (in total and per
// model, plus those other gateway replicas report, see PodLoad.SetRemote),
// the pending load their GPU profiles give, and the prefill queue: the
// attempts whose first token has not come back, in the order they were
// sent, each with the prefill work (in seconds) its route predicted. The
// queue is a first-come first-served model of the engine's scheduler: a
// prefill started at t is predicted done at F = max(F', t) + work, F' being
// the prediction for the one started before it, and Queue reports
// max(0, F - now) for the last one. A first token proves that its prefill
// and every one started on the pod before it are done: they leave the queue
// and the rest is predicted from that moment. A close without a first token
// proves less, that the prefill ended some time before: it and the ones
// before it leave the queue, and the prediction only moves earlier. The
// routing package's documentation derives how kv-aware reads the queue.
//
// PodLoads belong to whoever keeps the pods: the cache Store creates one
// per pod (per UID: a pod replaced by another of the same name starts at
// zero) and hands it to routing in each candidate's snapshot, so that a
// route names the PodLoad its attempt counts on.
//
// Per model, the requests in flight and how many of them have been routed
// (Ledger.Models), which request traces report.
//
// # Consumers
//
// Components that follow requests register an Observer with the ledger
// (Ledger.Observe): the router (its running mean of uncached tokens and
// its time-to-first-token prediction ratio), request traces (arrivals and
// the usage of completed requests), the output predictors (the usage of
// completed requests). Observers are called synchronously from the
// goroutine that drives the request, or from the reaper: they must return
// quickly.
//
// # Metrics
//
// New registers on Config.Registerer:
//
//	kvgate_cache_tracked_requests                  requests admitted and not ended
//	kvgate_cache_requests_expired_total            requests reaped after the TTL
//	kvgate_cache_request_done_ignored_total{reason} closes ignored: closed (already), expired (reaped before)
//	kvgate_routing_inflight_prefills               attempts whose prefill is queued
//	kvgate_routing_inflight_prefill_tokens         their predicted uncached prompt tokens
//	kvgate_routing_inflight_prefills_expired_total prefills dropped because their request was reaped
package inflight
