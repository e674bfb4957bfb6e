/* SPDX-License-Identifier: MIT */
/* The bridge's own Prometheus counters (text exposition format 0.0.4). main.c adds the per-daemon
 * gauges (reachability, queue depth, prefix hits) it reads from the daemons' Stats at scrape time.
 * Single-threaded: everything runs on the event loop, so plain integers suffice. */
#include <event2/buffer.h>
#include <stdio.h>
#include <string.h>

#include "bridge.h"

#define N_STATUS_SLOTS 96 /* endpoints x statuses seen; the bridge has ~12 endpoint labels */

struct status_count {
        const char *endpoint; /* a static string */
        int status;
        uint64_t n;
};

/* Bucket bounds in seconds: TTFT spans a cached prompt on a GPU (ms) to a long CPU prefill (s);
 * per-token latency spans ~1 ms (H200 decode) to a slow CPU (s). */
static const double ttft_bounds[] = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60 };
static const double tpot_bounds[] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5 };
#define N_TTFT (sizeof ttft_bounds / sizeof ttft_bounds[0])
#define N_TPOT (sizeof tpot_bounds / sizeof tpot_bounds[0])

struct histogram {
        uint64_t buckets[16]; /* per bound, not cumulative */
        uint64_t count;
        double sum;
};

static struct {
        struct status_count status[N_STATUS_SLOTS];
        size_t n_status;
        uint64_t prompt_tokens, completion_tokens, cached_tokens, cache_hit_requests, cancelled;
        struct histogram ttft, tpot;
} m;

void metrics_count_request(const char *endpoint, int status) {
        for (size_t i = 0; i < m.n_status; i++)
                if (m.status[i].status == status && strcmp(m.status[i].endpoint, endpoint) == 0) {
                        m.status[i].n++;
                        return;
                }
        if (m.n_status < N_STATUS_SLOTS)
                m.status[m.n_status++] = (struct status_count) { endpoint, status, 1 };
}

void metrics_add_tokens(uint64_t prompt, uint64_t completion, uint64_t cached) {
        m.prompt_tokens += prompt;
        m.completion_tokens += completion;
        m.cached_tokens += cached;
        if (cached > 0)
                m.cache_hit_requests++;
}

void metrics_count_cancelled(void) {
        m.cancelled++;
}

static void observe(struct histogram *h, const double *bounds, size_t n, double v) {
        size_t i = 0;
        while (i < n && v > bounds[i])
                i++;
        if (i < n)
                h->buckets[i]++;
        h->count++;
        h->sum += v;
}

void metrics_observe_ttft(double s) {
        observe(&m.ttft, ttft_bounds, N_TTFT, s);
}

void metrics_observe_token_latency(double s) {
        observe(&m.tpot, tpot_bounds, N_TPOT, s);
}

void metrics_label_escape(struct evbuffer *out, const char *v) {
        for (; *v; v++) {
                if (*v == '\\')
                        evbuffer_add(out, "\\\\", 2);
                else if (*v == '"')
                        evbuffer_add(out, "\\\"", 2);
                else if (*v == '\n')
                        evbuffer_add(out, "\\n", 2);
                else
                        evbuffer_add(out, v, 1);
        }
}

static void render_histogram(struct evbuffer *out, const char *name, const char *help,
                             const struct histogram *h, const double *bounds, size_t n) {
        uint64_t cum = 0;
        evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
        for (size_t i = 0; i < n; i++) {
                cum += h->buckets[i];
                evbuffer_add_printf(out, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i],
                                    (unsigned long long) cum);
        }
        evbuffer_add_printf(out, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name,
                            (unsigned long long) h->count, name, h->sum, name,
                            (unsigned long long) h->count);
}

static void counter(struct evbuffer *out, const char *name, const char *help, uint64_t v) {
        evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name,
                            (unsigned long long) v);
}

void metrics_render(struct evbuffer *out) {
        evbuffer_add_printf(out, "# HELP xing4_http_requests_total HTTP requests answered, by endpoint "
                                 "and status.\n# TYPE xing4_http_requests_total counter\n");
        for (size_t i = 0; i < m.n_status; i++)
                evbuffer_add_printf(out, "xing4_http_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n",
                                    m.status[i].endpoint, m.status[i].status,
                                    (unsigned long long) m.status[i].n);
        counter(out, "xing4_http_prompt_tokens_total", "Prompt tokens of finished generations.",
                m.prompt_tokens);
        counter(out, "xing4_http_completion_tokens_total", "Tokens generated.", m.completion_tokens);
        counter(out, "xing4_http_cached_prompt_tokens_total",
                "Prompt tokens the daemon took from its prefix cache.", m.cached_tokens);
        counter(out, "xing4_http_prefix_cache_hit_requests_total",
                "Generations that reused at least one cached prompt token.", m.cache_hit_requests);
        counter(out, "xing4_http_cancelled_total",
                "Generations cancelled (client gone or DELETE /v1/requests/ID).", m.cancelled);
        render_histogram(out, "xing4_http_time_to_first_token_seconds",
                         "Request received to first generated token.", &m.ttft, ttft_bounds, N_TTFT);
        render_histogram(out, "xing4_http_time_per_output_token_seconds",
                         "Time between consecutive generated tokens.", &m.tpot, tpot_bounds, N_TPOT);
}
