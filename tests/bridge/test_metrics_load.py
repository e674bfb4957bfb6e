# SPDX-License-Identifier: MIT
"""/metrics read by the reference Prometheus parser (Debian's python3-prometheus-client), and a
bounded load: 200 requests, 32 at a time, all answered properly, none hanging, memory back near
its baseline afterwards."""
import concurrent.futures
import json
import time

from prometheus_client.parser import text_string_to_metric_families

from conftest import chat


def scrape(bridge):
    st, hdrs, body = bridge.request("GET", "/metrics")
    assert st == 200 and hdrs["content-type"].startswith("text/plain; version=0.0.4")
    text = body.decode() if isinstance(body, bytes) else json.dumps(body)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    return fams


def value(fams, family, sample, **labels):
    for s in fams[family].samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return 0.0


def test_metrics_parse_and_count(make_bridge, daemon):
    b = make_bridge([daemon.sock])
    for _ in range(3):
        assert b.post("/v1/chat/completions", chat(max_tokens=4, temperature=0,
                                                   chat_template_kwargs={"enable_thinking": False}))[0] == 200
    assert b.post("/v1/chat/completions", chat(top_p=7))[0] == 400
    b.request("GET", "/v1/models")
    f = scrape(b)
    assert value(f, "xing4_http_requests", "xing4_http_requests_total", endpoint="chat", status="200") == 3
    assert value(f, "xing4_http_requests", "xing4_http_requests_total", endpoint="chat", status="400") == 1
    assert value(f, "xing4_http_requests", "xing4_http_requests_total", endpoint="models", status="200") == 1
    completion = value(f, "xing4_http_completion_tokens", "xing4_http_completion_tokens_total")
    assert 3 <= completion <= 12  # up to 4 tokens each, EOS may end one early
    assert value(f, "xing4_http_prompt_tokens", "xing4_http_prompt_tokens_total") > 0
    # one TTFT observation per generation, one per-token gap per further token
    assert f["xing4_http_time_to_first_token_seconds"].type == "histogram"
    assert value(f, "xing4_http_time_to_first_token_seconds", "xing4_http_time_to_first_token_seconds_count") == 3
    assert value(f, "xing4_http_time_per_output_token_seconds",
                 "xing4_http_time_per_output_token_seconds_count") == completion - 3
    inf = value(f, "xing4_http_time_to_first_token_seconds", "xing4_http_time_to_first_token_seconds_bucket",
                le="+Inf")
    assert inf == 3
    assert value(f, "xing4_daemon_up", "xing4_daemon_up", socket=daemon.sock) == 1
    assert value(f, "xing4_daemon_queue_depth", "xing4_daemon_queue_depth", socket=daemon.sock) == 0
    assert "xing4_daemon_prefix_hits" in f
    assert value(f, "xing4_http_requests_in_flight", "xing4_http_requests_in_flight") == 0
    # the same prompt again: the daemon's prefix cache serves part of it, usage and metrics say so
    st, _, body = b.post("/v1/chat/completions", chat(max_tokens=4, temperature=0,
                                                      chat_template_kwargs={"enable_thinking": False}))
    cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
    f = scrape(b)
    assert value(f, "xing4_http_cached_prompt_tokens", "xing4_http_cached_prompt_tokens_total") == cached
    if cached:
        assert value(f, "xing4_http_prefix_cache_hit_requests", "xing4_http_prefix_cache_hit_requests_total") == 1


def test_metrics_report_an_unreachable_daemon(make_bridge, tmp_path):
    b = make_bridge([str(tmp_path / "gone.sock")])
    f = scrape(b)
    assert value(f, "xing4_daemon_up", "xing4_daemon_up", socket=str(tmp_path / "gone.sock")) == 0


def test_load_200_requests_32_concurrent(make_bridge, daemon):
    # the default cap (64) is above 32: every request is admitted; the daemon queues beyond its
    # 4 running ones
    b = make_bridge([daemon.sock])

    def one(i):
        body = chat(f"request {i % 7}", max_tokens=6, stream=(i % 2 == 0),
                    chat_template_kwargs={"enable_thinking": False})
        st, hdrs, data = b.post("/v1/chat/completions", body, timeout=120)
        return i, st, hdrs, data

    def run(n):
        with concurrent.futures.ThreadPoolExecutor(32) as ex:
            return list(ex.map(one, range(n)))

    run(32)  # warm-up: buffers and allocator arenas reach their working size
    baseline = b.rss_kib()
    t0 = time.monotonic()
    results = run(200)
    elapsed = time.monotonic() - t0
    for i, st, hdrs, data in results:
        assert st == 200, (i, st, data)
        if i % 2 == 0:
            text = data.decode()
            assert text.endswith("data: [DONE]\n\n"), text[-200:]
        else:
            assert data["choices"][0]["finish_reason"] in ("stop", "length")
    f = scrape(b)
    assert value(f, "xing4_http_requests_in_flight", "xing4_http_requests_in_flight") == 0
    after = b.rss_kib()
    # nothing kept per request: RSS within 4 MiB of the warmed-up baseline
    assert after - baseline < 4096, (baseline, after)
    print(f"200 requests in {elapsed:.1f} s, all 200; RSS {baseline} -> {after} KiB")
