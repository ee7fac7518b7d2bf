#!/usr/bin/env python3
"""Writes the vLLM /metrics expositions the cache tests scrape.

Each file follows what vLLM's API server serves (prometheus_client text
format 0.0.4): metric names, label sets, HELP texts, bucket layouts and the
_created gauges of vLLM v1 (v0.10+) or, for vllm_v0_gpu_cache.txt, of the V0
engine (v0.6), with counter values chosen so that the tests can check the
derived metrics by hand. Run it from this directory to regenerate them.
"""

M = 'meta-llama/Llama-3.1-8B-Instruct'

def lbl(d):
    return '{' + ','.join(f'{k}="{v}"' for k, v in d.items()) + '}' if d else ''

def gauge(name, help_, series):
    out = [f'# HELP {name} {help_}', f'# TYPE {name} gauge']
    return out + [f'{name}{lbl(l)} {float(v)!r}' for l, v in series]

def counter(name, help_, series, created=True):
    out = [f'# HELP {name}_total {help_}', f'# TYPE {name}_total counter']
    out += [f'{name}_total{lbl(l)} {float(v)!r}' for l, v in series]
    if created:
        out += [f'# HELP {name}_created {help_}', f'# TYPE {name}_created gauge']
        out += [f'{name}_created{lbl(l)} 1.7438593814e+09' for l, _ in series]
    return out

def hist(name, help_, buckets, series, created=True):
    """series: (labels, count, sum); the observations are spread evenly over the buckets."""
    out = [f'# HELP {name} {help_}', f'# TYPE {name} histogram']
    for l, count, total in series:
        for i, b in enumerate(buckets):
            cum = int(count * (i + 1) / (len(buckets) + 1))
            out.append(f'{name}_bucket{lbl({**l, "le": str(b)})} {float(cum)!r}')
        out.append(f'{name}_bucket{lbl({**l, "le": "+Inf"})} {float(count)!r}')
        out.append(f'{name}_count{lbl(l)} {float(count)!r}')
        out.append(f'{name}_sum{lbl(l)} {float(total)!r}')
    if created:
        out += [f'# HELP {name}_created {help_}', f'# TYPE {name}_created gauge']
        out += [f'{name}_created{lbl(l)} 1.7438593814e+09' for l, _, _ in series]
    return out

PROCESS = '''# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 18372.0
python_gc_objects_collected_total{generation="1"} 3311.0
python_gc_objects_collected_total{generation="2"} 702.0
# HELP python_info Python platform information
# TYPE python_info gauge
python_info{implementation="CPython",major="3",minor="12",patchlevel="11",version="3.12.11"} 1.0
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 2.831466496e+09
# HELP process_open_fds Number of open file descriptors.
# TYPE process_open_fds gauge
process_open_fds 61.0'''.split('\n')

TTFT_B = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_B = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
REQ_B = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
TOK_B = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]

def cache_info(engine, blocks):
    l = {'block_size': '16', 'cache_dtype': 'auto', 'calculate_kv_scales': 'False', 'cpu_offload_gb': '0',
         'enable_prefix_caching': 'True'}
    if engine is not None:
        l['engine'] = engine
    l.update({'gpu_memory_utilization': '0.9', 'is_attention_free': 'False', 'num_cpu_blocks': 'None',
              'num_gpu_blocks': str(blocks), 'num_gpu_blocks_override': 'None', 'prefix_caching_hash_algo': 'sha256',
              'sliding_window': 'None', 'swap_space': '4', 'swap_space_bytes': '4294967296'})
    return l

def v1(engines):
    """engines: (labels, values) per engine."""
    out = list(PROCESS)
    out += gauge('vllm:num_requests_running', 'Number of requests in model execution batches.', [(l, v['running']) for l, v in engines])
    out += gauge('vllm:num_requests_waiting', 'Number of requests waiting to be processed.', [(l, v['waiting']) for l, v in engines])
    out += gauge('vllm:kv_cache_usage_perc', 'KV-cache usage. 1 means 100 percent usage.', [(l, v['kv']) for l, v in engines])
    out += counter('vllm:prefix_cache_queries', 'Prefix cache queries, in terms of number of queried tokens.', [(l, v['queries']) for l, v in engines])
    out += counter('vllm:prefix_cache_hits', 'Prefix cache hits, in terms of number of cached tokens.', [(l, v['hits']) for l, v in engines])
    out += counter('vllm:num_preemptions', 'Cumulative number of preemption from the engine.', [(l, 0) for l, v in engines])
    out += counter('vllm:prompt_tokens', 'Number of prefill tokens processed.', [(l, v['prompt']) for l, v in engines])
    out += counter('vllm:generation_tokens', 'Number of generation tokens processed.', [(l, v['prompt'] // 4) for l, v in engines])
    out += hist('vllm:iteration_tokens_total', 'Histogram of number of tokens per engine_step.', TOK_B, [(l, v['ttft'][0] * 30, v['prompt'] * 1.2) for l, v in engines])
    out += hist('vllm:time_to_first_token_seconds', 'Histogram of time to first token in seconds.', TTFT_B, [(l, *v['ttft']) for l, v in engines])
    out += hist('vllm:time_per_output_token_seconds', 'Histogram of time per output token in seconds.DEPRECATED: Use vllm:inter_token_latency_seconds instead.', ITL_B, [(l, *v['tpot_old']) for l, v in engines])
    out += hist('vllm:inter_token_latency_seconds', 'Histogram of inter-token latency in seconds.', ITL_B, [(l, *v['itl']) for l, v in engines])
    out += hist('vllm:e2e_request_latency_seconds', 'Histogram of e2e request latency in seconds.', REQ_B, [(l, *v['e2e']) for l, v in engines])
    out += hist('vllm:request_queue_time_seconds', 'Histogram of time spent in WAITING phase for request.', REQ_B, [(l, v['e2e'][0], v['e2e'][1] * 0.05) for l, v in engines])
    out += hist('vllm:request_prefill_time_seconds', 'Histogram of time spent in PREFILL phase for request.', REQ_B, [(l, *v['prefill']) for l, v in engines])
    out += hist('vllm:request_decode_time_seconds', 'Histogram of time spent in DECODE phase for request.', REQ_B, [(l, v['e2e'][0], v['e2e'][1] * 0.7) for l, v in engines])
    out += gauge('vllm:cache_config_info', 'Information of the LLMEngine CacheConfig', [(cache_info(l['engine'], v['blocks']), 1) for l, v in engines])
    return '\n'.join(out) + '\n'

def v0(model, v):
    """The V0 engine: no engine label, gpu/cpu cache usage, no prefix-cache counters, no prefill-time histogram."""
    l = {'model_name': model}
    out = list(PROCESS)
    out += gauge('vllm:cache_config_info', 'Information of the LLMEngine CacheConfig', [(cache_info(None, v['blocks']), 1)])
    out += gauge('vllm:num_requests_running', 'Number of requests currently running on GPU.', [(l, v['running'])])
    out += gauge('vllm:num_requests_swapped', 'Number of requests swapped to CPU.', [(l, 0)])
    out += gauge('vllm:num_requests_waiting', 'Number of requests waiting to be processed.', [(l, v['waiting'])])
    out += gauge('vllm:gpu_cache_usage_perc', 'GPU KV-cache usage. 1 means 100 percent usage.', [(l, v['kv'])])
    out += gauge('vllm:cpu_cache_usage_perc', 'CPU KV-cache usage. 1 means 100 percent usage.', [(l, 0.0)])
    out += gauge('vllm:cpu_prefix_cache_hit_rate', 'CPU prefix cache block hit rate.', [(l, -1)])
    out += gauge('vllm:gpu_prefix_cache_hit_rate', 'GPU prefix cache block hit rate.', [(l, 0.35)])
    out += counter('vllm:num_preemptions', 'Cumulative number of preemption from the engine.', [(l, 0)], created=False)
    out += counter('vllm:prompt_tokens', 'Number of prefill tokens processed.', [(l, v['prompt'])], created=False)
    out += counter('vllm:generation_tokens', 'Number of generation tokens processed.', [(l, v['prompt'] // 3)], created=False)
    out += hist('vllm:time_to_first_token_seconds', 'Histogram of time to first token in seconds.', TTFT_B, [(l, *v['ttft'])], created=False)
    out += hist('vllm:time_per_output_token_seconds', 'Histogram of time per output token in seconds.', ITL_B, [(l, *v['tpot_old'])], created=False)
    out += hist('vllm:e2e_request_latency_seconds', 'Histogram of end to end request latency in seconds.', REQ_B, [(l, *v['e2e'])], created=False)
    return '\n'.join(out) + '\n'

def values(**v):
    v.setdefault('blocks', 27000)
    return v

E0 = {'engine': '0', 'model_name': M}
E1 = {'engine': '1', 'model_name': M}
FILES = {
    # One engine, scraped four times; the engine restarts between t1 and t2.
    'vllm_v1_t0.txt': v1([(E0, values(running=4, waiting=1, kv=0.42, queries=10000, hits=4000, prompt=20000,
        ttft=(50, 10.0), itl=(5000, 100.0), tpot_old=(5000, 250.0), e2e=(50, 150.0), prefill=(50, 8.0)))]),
    'vllm_v1_t1.txt': v1([(E0, values(running=6, waiting=0, kv=0.5, queries=12000, hits=5500, prompt=24000,
        ttft=(60, 13.0), itl=(6000, 130.0), tpot_old=(6000, 400.0), e2e=(60, 190.0), prefill=(60, 9.0)))]),
    'vllm_v1_t2_restarted.txt': v1([(E0, values(running=1, waiting=0, kv=0.05, queries=300, hits=100, prompt=500,
        ttft=(2, 0.5), itl=(40, 1.2), tpot_old=(40, 2.0), e2e=(2, 3.0), prefill=(2, 0.4)))]),
    'vllm_v1_t3.txt': v1([(E0, values(running=2, waiting=0, kv=0.1, queries=1300, hits=600, prompt=3500,
        ttft=(12, 4.5), itl=(140, 5.2), tpot_old=(140, 9.0), e2e=(12, 23.0), prefill=(12, 2.4)))]),
    # Two data-parallel engines of one model.
    'vllm_v1_dp2.txt': v1([
        (E0, values(running=4, waiting=1, kv=0.42, queries=10000, hits=4000, prompt=20000,
            ttft=(50, 10.0), itl=(5000, 100.0), tpot_old=(5000, 250.0), e2e=(50, 150.0), prefill=(50, 8.0))),
        (E1, values(running=3, waiting=2, kv=0.2, queries=5000, hits=1000, prompt=8000,
            ttft=(20, 6.0), itl=(2000, 60.0), tpot_old=(2000, 60.0), e2e=(20, 80.0), prefill=(20, 4.0), blocks=25000))]),
    # One exposition covering two models.
    'vllm_v1_two_models.txt': v1([
        ({'engine': '0', 'model_name': 'qwen2.5-7b'}, values(running=7, waiting=3, kv=0.7, queries=1000, hits=900, prompt=2000,
            ttft=(10, 1.0), itl=(100, 2.0), tpot_old=(100, 2.0), e2e=(10, 20.0), prefill=(10, 0.5))),
        ({'engine': '0', 'model_name': 'llama-3-8b'}, values(running=1, waiting=0, kv=0.1, queries=1000, hits=100, prompt=2000,
            ttft=(10, 5.0), itl=(100, 4.0), tpot_old=(100, 4.0), e2e=(10, 50.0), prefill=(10, 2.0)))]),
    # The V0 engine: only the old gpu_cache_usage_perc gauge.
    'vllm_v0_gpu_cache.txt': v0(M, values(running=2, waiting=5, kv=0.31, prompt=9000, blocks=7221,
        ttft=(30, 12.0), tpot_old=(3000, 90.0), e2e=(30, 120.0))),
}

if __name__ == '__main__':
    for name, text in FILES.items():
        with open(name, 'w') as f:
            f.write(text)
