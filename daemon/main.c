/* SPDX-License-Identifier: MIT */
/* xing4d: arguments and config, model load with progress reported to systemd, the engine thread,
 * the socket (socket activation, else --listen), and the lifecycle (docs/design.md "systemd and
 * files"): READY=1 once serving, STOPPING=1 on SIGTERM, exit 0 after draining. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "../kernels/backend.h"
#include "gguf/gguf.h"
#include "chat/tokenizer.h"
#include "model/xing4.h"
#include "scheduler.h"
#include "server.h"
#include "common/frame.h"
#include "common/log.h"
#include "common/util.h"

#define XING4D_VERSION "0.1.0"
#define DEFAULT_CONFIG "/etc/xing4d/xing4d.conf"
/* The model served when none is configured: the xing4d-demo-model package's (meson.build sets it
 * from the prefix and datadir, /usr/share/xing4d/models/xing4-demo/model.gguf in the package). */
#ifndef X4_DEFAULT_MODEL
#define X4_DEFAULT_MODEL "/usr/share/xing4d/models/xing4-demo/model.gguf"
#endif

/* --mtp: auto (the default) drafts where it measured faster: with the CUDA backend, when the
 * model has a NextN block (the trained demo model on the H200: 1.18-1.25x, bench/RESULTS.md),
 * not on the CPU, where a verify step of k+1 tokens costs about k+1 steps (0.54-0.83x there) */
enum mtp_mode { MTP_AUTO, MTP_OFF, MTP_ON };

/* The output limit of a request that sets none. OpenAI clients and agents often send none and
 * expect the answer's natural end (OpenAI, vLLM and llama.cpp's server run to the context); Codex
 * sends none, and at the former 1,024 its turns on the demo model ended "incomplete"
 * (max_output_tokens) where 8,192 let them finish (1,874 tokens once). Cache pages are taken as
 * a sequence grows, so a generous default costs nothing until used; it still bounds a model that
 * never ends its turn (the random-weight presets). */
#define MAX_TOKENS_DEFAULT 16384u

struct options {
        char *model;
        const char *config_file; /* the INI file read (for messages) */
        char *config_json;
        char *tokenizer_path;
        bool assume_release_defaults;
        char *device; /* cpu | cuda | auto */
        uint32_t threads;
        char *listen;
        char *state_dir;
        uint32_t max_running;
        uint32_t max_waiting;
        uint32_t max_tokens;
        uint32_t max_frame;
        uint32_t max_connections;
        uint32_t page_tokens;
        uint32_t cache_pages;
        uint64_t memory_limit;
        uint64_t output_buffer;
        uint32_t prefill_chunk;
        uint32_t prefix_pages; /* 0: the whole cache */
        uint32_t max_messages;
        uint32_t max_snapshots;
        uint64_t max_snapshot_bytes;
        uint64_t snapshot_chunk;
        double grace_s;
        double hello_timeout_s;
        double idle_timeout_s;
        uint64_t max_pending_bytes;
        uint32_t max_tokens_limit; /* 0: none (the context limit) */
        uint32_t prefill_budget;   /* 0: adaptive */
        enum mtp_mode mtp;         /* MTP speculative decoding with the NextN block */
        uint32_t mtp_draft;        /* drafts per step, 1..SCHED_MTP_DRAFT_MAX */
        bool mtp_match;            /* --mtp-sampling match */
        uint32_t cpu_math;         /* enum x4_cpu_math: the CPU backend's numerics */
        int log_level;
};

static void options_free(struct options *o) {
        free(o->model);
        free(o->config_json);
        free(o->tokenizer_path);
        free(o->device);
        free(o->listen);
        free(o->state_dir);
}

static int set_str(char **dst, const char *v) {
        /* "key =" with nothing after it is the default (the packaged file shows "#listen =",
         * "#config-json ="): an empty path was bound or opened as given -- for listen an
         * unreachable abstract socket, while the daemon said it was serving */
        if (!*v) {
                free(*dst);
                *dst = NULL;
                return 0;
        }
        char *d = strdup(v);
        if (!d)
                return -ENOMEM;
        free(*dst);
        *dst = d;
        return 0;
}

/* One setting by its long name, from a flag or a config line. `where` names the source for
 * messages ("--threads", "/etc/xing4d/xing4d.conf:7"). */
static int apply_option(struct options *o, const char *key, const char *v, const char *where) {
        int r = 0;
        /* a config line's message names the setting too (a flag's `where` is its name already) */
        char sfx[128] = "";
        if (where[0] != '-')
                snprintf(sfx, sizeof sfx, " (setting '%.100s')", key);
        if (streq(key, "model"))
                r = set_str(&o->model, v);
        else if (streq(key, "config-json"))
                r = set_str(&o->config_json, v);
        else if (streq(key, "tokenizer-path"))
                r = set_str(&o->tokenizer_path, v);
        else if (streq(key, "assume-release-defaults")) {
                if (parse_bool(v, &o->assume_release_defaults) < 0)
                        return log_error_errno(EINVAL, "%s: '%s' is not a boolean (yes/no)%s", where, v, sfx);
        } else if (streq(key, "device")) {
                if (!streq(v, "cpu") && !streq(v, "cuda") && !streq(v, "auto"))
                        return log_error_errno(EINVAL, "%s: device '%s', one of cpu, cuda, auto expected%s",
                                               where, v, sfx);
                r = set_str(&o->device, v);
        } else if (streq(key, "listen"))
                r = set_str(&o->listen, v);
        else if (streq(key, "state-dir"))
                r = set_str(&o->state_dir, v);
        else if (streq(key, "memory-limit") || streq(key, "gpu-memory-limit")) {
                if (parse_size(v, &o->memory_limit) < 0)
                        return log_error_errno(EINVAL, "%s: '%s' is not a size (e.g. 8G, 512M)%s", where, v, sfx);
        } else if (streq(key, "max-snapshot-bytes")) {
                if (parse_size(v, &o->max_snapshot_bytes) < 0 || o->max_snapshot_bytes == 0)
                        return log_error_errno(EINVAL, "%s: '%s' is not a nonzero size (e.g. 64G)%s",
                                               where, v, sfx);
        } else if (streq(key, "snapshot-chunk")) {
                if (parse_size(v, &o->snapshot_chunk) < 0 || o->snapshot_chunk < 4096 ||
                    o->snapshot_chunk > ((uint64_t) 1 << 32))
                        return log_error_errno(EINVAL, "%s: '%s' is not a size in [4K, 4G]%s", where, v, sfx);
        } else if (streq(key, "max-frame")) { /* bytes, or a size like the other byte settings */
                uint64_t b;
                if (parse_size(v, &b) < 0 || b < 1024 || b > FRAME_MAX_LIMIT)
                        return log_error_errno(EINVAL, "%s: '%s' is not a size in [1K, %uM]%s", where, v,
                                               (unsigned) (FRAME_MAX_LIMIT >> 20), sfx);
                o->max_frame = (uint32_t) b;
        } else if (streq(key, "output-buffer")) {
                if (parse_size(v, &o->output_buffer) < 0 || o->output_buffer < 1024 ||
                    o->output_buffer > (1u << 30))
                        return log_error_errno(EINVAL, "%s: '%s' is not a size in [1K, 1G]%s", where, v, sfx);
        } else if (streq(key, "grace")) {
                char *end;
                errno = 0;
                double g = strtod(v, &end);
                if (errno || *end || !(g >= 0 && g <= 3600))
                        return log_error_errno(EINVAL, "%s: '%s' is not a number of seconds in [0, 3600]%s",
                                               where, v, sfx);
                o->grace_s = g;
        } else if (streq(key, "idle-timeout")) {
                char *end;
                errno = 0;
                double t = strtod(v, &end);
                if (errno || *end || !(t >= 0 && t <= 86400))
                        return log_error_errno(EINVAL, "%s: '%s' is not a number of seconds in [0, 86400]%s",
                                               where, v, sfx);
                o->idle_timeout_s = t;
        } else if (streq(key, "max-pending-bytes")) {
                if (parse_size(v, &o->max_pending_bytes) < 0 || o->max_pending_bytes < (1u << 20))
                        return log_error_errno(EINVAL, "%s: '%s' is not a size of at least 1M (e.g. 256M)%s",
                                               where, v, sfx);
        } else if (streq(key, "hello-timeout")) {
                char *end;
                errno = 0;
                double t = strtod(v, &end);
                if (errno || *end || !(t >= 0 && t <= 3600))
                        return log_error_errno(EINVAL, "%s: '%s' is not a number of seconds in [0, 3600]%s",
                                               where, v, sfx);
                o->hello_timeout_s = t;
        } else if (streq(key, "mtp")) {
                if (streq(v, "on") || streq(v, "true") || streq(v, "1"))
                        o->mtp = MTP_ON;
                else if (streq(v, "off") || streq(v, "false") || streq(v, "0"))
                        o->mtp = MTP_OFF;
                else if (streq(v, "auto"))
                        o->mtp = MTP_AUTO;
                else
                        return log_error_errno(EINVAL, "%s: '%s', off, on or auto expected%s", where, v, sfx);
        } else if (streq(key, "cpu-math")) {
                if (streq(v, "fp32"))
                        o->cpu_math = X4_CPU_MATH_FP32;
                else if (streq(v, "fast"))
                        o->cpu_math = X4_CPU_MATH_FAST;
                else
                        return log_error_errno(EINVAL, "%s: '%s', fp32 or fast expected%s", where, v, sfx);
        } else if (streq(key, "mtp-sampling")) {
                if (streq(v, "rejection") || streq(v, "match"))
                        o->mtp_match = streq(v, "match");
                else
                        return log_error_errno(EINVAL, "%s: '%s', rejection or match expected%s", where, v, sfx);
        } else if (streq(key, "log-level")) {
                int lvl = log_level_from_string(v);
                if (lvl < 0)
                        return log_error_errno(EINVAL, "%s: log level '%s', one of err, warning, "
                                                       "info, debug expected%s", where, v, sfx);
                o->log_level = lvl;
        } else {
                static const struct { const char *name; size_t off; uint32_t min, max; } nums[] = {
                        { "threads", offsetof(struct options, threads), 0, 4096 },
                        { "max-running", offsetof(struct options, max_running), 1, 4096 },
                        { "max-waiting", offsetof(struct options, max_waiting), 0, 1u << 20 },
                        { "max-tokens", offsetof(struct options, max_tokens), 1, 1u << 24 },
                        { "max-tokens-limit", offsetof(struct options, max_tokens_limit), 0, 1u << 24 },
                        { "prefill-budget", offsetof(struct options, prefill_budget), 0, 1u << 20 },
                        { "max-connections", offsetof(struct options, max_connections), 1, 1u << 20 },
                        { "page-tokens", offsetof(struct options, page_tokens), 1, 65536 },
                        { "cache-pages", offsetof(struct options, cache_pages), 0, 1u << 24 },
                        { "prefill-chunk", offsetof(struct options, prefill_chunk), 1, 65536 },
                        { "prefix-pages", offsetof(struct options, prefix_pages), 0, 1u << 24 },
                        { "max-messages", offsetof(struct options, max_messages), 1, 1u << 20 },
                        { "max-snapshots", offsetof(struct options, max_snapshots), 1, 1u << 20 },
                        { "mtp-draft", offsetof(struct options, mtp_draft), 1, SCHED_MTP_DRAFT_MAX },
                };
                for (size_t i = 0; i < ELEMENTSOF(nums); i++)
                        if (streq(key, nums[i].name)) {
                                uint32_t x;
                                if (parse_u32(v, &x) < 0 || x < nums[i].min || x > nums[i].max)
                                        return log_error_errno(EINVAL, "%s: '%s' is not an integer in [%u, %u]%s",
                                                               where, v, nums[i].min, nums[i].max, sfx);
                                *(uint32_t *) ((char *) o + nums[i].off) = x;
                                return 0;
                        }
                return log_error_errno(EINVAL, "%s: unknown setting '%s'", where, key);
        }
        if (r < 0)
                return log_error_errno(r, "%s: out of memory", where);
        return 0;
}

/* INI: `key = value` lines, `[section]` headers (only [xing4d] and [daemon] hold our keys),
 * `#`/`;` comments. A missing default file is fine; a missing --config file is an error. */
static int load_config(struct options *o, const char *path, bool required) {
        _cleanup_fclose_ FILE *f = fopen(path, "re");
        char line[4096], where[PATH_MAX + 32];
        unsigned lineno = 0;
        bool ours = true;
        /* the keys set so far and their lines: a second one is a mistake worth a word */
        struct { char key[48]; unsigned line; } seen[128];
        size_t n_seen = 0;

        if (!f) {
                if (errno == ENOENT && !required)
                        return 0;
                return log_error_errno(errno, "config %s: cannot open: %m", path);
        }
        while (fgets(line, sizeof line, f)) {
                lineno++;
                snprintf(where, sizeof where, "%s:%u", path, lineno);
                size_t len = strlen(line);
                if (len == sizeof line - 1 && line[len - 1] != '\n') {
                        /* fgets stopped at the buffer, not at the end of the line: the rest would
                         * be read as a line of its own (a value cut in two, a key out of thin air) */
                        int ch = fgetc(f);
                        if (ch != EOF)
                                return log_error_errno(E2BIG, "%s: line longer than %zu bytes", where,
                                                       sizeof line - 1);
                }
                char *s = line;
                if (lineno == 1 && memcmp(s, "\xef\xbb\xbf", 3) == 0)
                        s += 3; /* a UTF-8 byte order mark (some editors write one) */
                s = strip(s);
                if (!*s || *s == '#' || *s == ';')
                        continue;
                if (*s == '[') {
                        char *e = strchr(s, ']');
                        if (!e || e[1])
                                return log_error_errno(EINVAL, "%s: section header '%s' lacks its ']'",
                                                       where, s);
                        *e = 0;
                        ours = streq(s + 1, "xing4d") || streq(s + 1, "daemon");
                        /* a misspelt header ([xing4], [Xing4d]) would drop every setting under it
                         * without a word */
                        if (!ours)
                                log_warning("%s: section [%s] is not [xing4d]: the settings under it are "
                                            "ignored", where, s + 1);
                        continue;
                }
                char *eq = strchr(s, '=');
                if (!eq)
                        return log_error_errno(EINVAL, "%s: 'key = value' expected, got '%s'", where, s);
                *eq = 0;
                char *key = strip(s), *val = eq + 1;
                /* a comment after the value: '#' or ';' between spaces, or ending the line after one
                 * ("threads = 4  # cores"); a path holding " #1" or " ;x" keeps them */
                for (char *c = val; *c; c++)
                        if ((*c == '#' || *c == ';') && c > val && (c[-1] == ' ' || c[-1] == '\t') &&
                            (c[1] == ' ' || c[1] == '\t' || c[1] == '\n' || c[1] == '\r' || !c[1])) {
                                *c = 0;
                                break;
                        }
                val = strip(val);
                if (!ours)
                        continue;
                /* underscores are accepted for dashes (max_running = max-running) */
                for (char *p = key; *p; p++)
                        if (*p == '_')
                                *p = '-';
                for (size_t i = 0; i < n_seen; i++)
                        if (streq(seen[i].key, key))
                                log_warning("%s: '%s' is set again (line %u set it before): the later "
                                            "value wins", where, key, seen[i].line);
                if (n_seen < ELEMENTSOF(seen) && strlen(key) < sizeof seen[0].key) {
                        snprintf(seen[n_seen].key, sizeof seen[0].key, "%s", key);
                        seen[n_seen++].line = lineno;
                }
                int r = apply_option(o, key, val, where);
                if (r < 0)
                        return r;
        }
        return 0;
}

static void help(void) {
        printf("xing4d [OPTIONS]  -- serve a Xing4 (xing4_0) GGUF model over a Unix socket\n\n"
               "  --config PATH                INI config (default " DEFAULT_CONFIG "); flags override it\n"
               "  --model PATH                 the .gguf\n"
               "  --config-json PATH           the model's config.json, or the folder holding it\n"
               "  --tokenizer-path DIR         folder holding config.json\n"
               "  --assume-release-defaults    no config.json: use the release's values (docs/model.md §2.2)\n"
               "  --device cpu|cuda|auto       backend (default auto: cuda if it loads, else cpu)\n"
               "  --threads N                  CPU backend threads (0 = all)\n"
               "  --listen PATH                bind this socket (else take it from systemd)\n"
               "  --state-dir DIR              snapshots (default /var/lib/xing4d)\n"
               "  --max-running N              requests decoding at once (16)\n"
               "  --max-waiting N              queued requests beyond that (256; 0 = none)\n"
               "  --max-tokens N               output limit of a request that sets none (16384)\n"
               "  --max-tokens-limit N         ceiling on any request's max_tokens: above it the\n"
               "                               output is cut there, ending with 'length' (0 = none)\n"
               "  --max-frame SIZE             largest accepted frame (16M; bytes, or K/M/G)\n"
               "  --max-connections N          (1024; kept below the open file limit)\n"
               "  --max-messages N             chat messages per request (4096)\n"
               "  --max-snapshots N            snapshot files in the state dir (64)\n"
               "  --max-snapshot-bytes SIZE    their total size (64G)\n"
               "  --snapshot-chunk SIZE        cache bytes a snapshot being saved copies out at a\n"
               "                               time while the disk write runs off the engine (64M)\n"
               "  --page-tokens N              tokens per cache page (256)\n"
               "  --cache-pages N              cache pages (0 = from the memory limit)\n"
               "  --memory-limit SIZE          bytes the backend may use (e.g. 8G)\n"
               "  --gpu-memory-limit SIZE      the same; on --device cuda it emulates a smaller\n"
               "                               card (22G: a 2080 Ti)\n"
               "  --prefill-chunk N            most prompt tokens of one request per step (default: the\n"
               "                               backend's pass, 256 on the CPU, up to 4096 on CUDA)\n"
               "  --prefill-budget N           prompt tokens per step while others decode (0 =\n"
               "                               adaptive: a step stays within ~4 decode steps)\n"
               "  --prefix-pages N             cache pages the prefix store may keep for reuse\n"
               "                               (0 = any free page; evicted LRU when needed)\n"
               "  --grace SECONDS              SIGTERM: time running requests get to finish (30)\n"
               "  --hello-timeout SECONDS      close a connection that sends no Hello by then (10; 0 = never)\n"
               "  --idle-timeout SECONDS       close a connection with nothing in flight and nothing\n"
               "                               received for this long (600; 0 = never). At the\n"
               "                               connection limit the one idle the longest is closed\n"
               "  --max-pending-bytes SIZE     unfinished frames over 64K held for all connections\n"
               "                               together (256M); a frame beyond it is refused\n"
               "  --output-buffer SIZE         output queued to a client before its requests pause (8M)\n"
               "  --mtp off|on|auto            speculative decoding with the model's NextN block\n"
               "                               (auto: on with the CUDA backend when the model has the\n"
               "                               block, off on the CPU; greedy output is the same either\n"
               "                               way, see xing4d(8))\n"
               "  --mtp-draft N                drafts per step with MTP on, 1..3 (1)\n"
               "  --mtp-sampling rejection|match  sampled requests: rejection sampling of the drafts\n"
               "                               (same distribution as --mtp off), or keep a draft only\n"
               "                               when it is the token drawn (same tokens per seed)\n"
               "  --cpu-math fast|fp32         the CPU backend's numerics: fast (default: integer and BF16\n"
               "                               products on rounded activations, packed weights), or the\n"
               "                               fp32 reference the parity tests hold to; see xing4d(8)\n"
               "  --log-level LEVEL            err, warning, info, debug (also emerg, alert, crit, notice)\n"
               "  --version\n");
}

/* Load progress is two phases on one 0..100% scale: reading the mapped weights from disk
 * (0..50%), then the backend making them resident (50..100%: the CUDA upload; the CPU backend
 * has nothing left to do and reports its end). */
struct progress_state {
        int last_pct;
        double base, scale;
};

static void load_progress(double fraction, const char *what, void *userdata) {
        struct progress_state *p = userdata;
        int pct = (int) ((p->base + p->scale * MIN(MAX(fraction, 0.0), 1.0)) * 100.0);
        if (pct == p->last_pct)
                return;
        p->last_pct = pct;
        /* each report buys another 60 s of start-up time (a 17 GB load from a slow disk) */
        (void) sd_notifyf(0, "STATUS=loading %d%% (%s)\nEXTEND_TIMEOUT_USEC=60000000", pct,
                          what ? what : "weights");
}

/* Read the mapped tensor data once, in chunks (madvise WILLNEED, then one byte per page), so a
 * checkpoint of many GiB on a slow disk loads with a progress report instead of faulting in
 * silently during the first requests. Skipped (logged) when it would not fit in free RAM: the
 * page cache would only evict what it just read. */
static void read_weights(const struct x4_model *m, struct progress_state *ps) {
        const struct gguf_file *g = x4_model_gguf(m);
        const struct gguf_tensor *t0 = gguf_tensor_count(g) ? gguf_tensor_at(g, 0) : NULL;
        long page = sysconf(_SC_PAGESIZE), avail = sysconf(_SC_AVPHYS_PAGES);
        uint64_t size = gguf_file_size(g) - gguf_data_offset(g);

        if (!t0 || size == 0 || page <= 0)
                return;
        if (avail > 0 && size > (uint64_t) avail * (uint64_t) page) {
                log_info("weights: %.1f GiB of tensor data, %.1f GiB of RAM free: not read ahead",
                         size / 1073741824.0, (double) avail * page / 1073741824.0);
                return;
        }
        /* the data section starts `offset` bytes before the first tensor's data */
        const char *base = (const char *) t0->data - t0->offset;
        uintptr_t start = (uintptr_t) base & ~((uintptr_t) page - 1);
        uintptr_t end = (uintptr_t) base + size;
        uint64_t chunk = MIN(MAX((end - start) / 64, (uint64_t) 64 << 10), (uint64_t) 256 << 20);
        chunk = (chunk + (uint64_t) page - 1) & ~((uint64_t) page - 1);
        volatile unsigned char sink = 0;
        for (uintptr_t at = start; at < end; at += chunk) {
                size_t n = (size_t) MIN((uint64_t) (end - at), chunk);
                (void) madvise((void *) at, n, MADV_WILLNEED);
                for (size_t k = 0; k < n; k += (size_t) page)
                        sink ^= *(const volatile unsigned char *) (at + k);
                load_progress((double) (at + n - start) / (double) (end - start),
                              "reading weights", ps);
        }
        (void) sink;
}

/* --listen PATH where a daemon answers: refuse (replacing its socket would cut it off from every
 * new client, and its exit would later delete ours). A socket file nobody answers on is stale.
 * A path that can never be bound (too long, in a missing folder, another kind of file there) is
 * refused too: all of this runs before the model load, so the mistake is named in a moment. */
static int check_listen_free(const char *path) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        struct stat st;

        if (strlen(path) >= sizeof sa.sun_path)
                return log_error_errno(ENAMETOOLONG, "--listen %s: longer than %zu bytes", path,
                                       sizeof sa.sun_path - 1);
        _cleanup_free_ char *dir = strdup(path);
        if (dir) {
                char *slash = strrchr(dir, '/');
                if (slash)
                        *(slash == dir ? slash + 1 : slash) = 0;
                if (slash && stat(dir, &st) < 0)
                        return log_error_errno(ENOENT, "--listen %s: the folder %s does not exist", path, dir);
                if (slash && !S_ISDIR(st.st_mode))
                        return log_error_errno(ENOTDIR, "--listen %s: %s is not a folder", path, dir);
                if (slash && access(dir, W_OK | X_OK) < 0)
                        return log_error_errno(errno, "--listen %s: cannot create a socket in %s: %m", path, dir);
        }
        if (lstat(path, &st) < 0)
                return 0;
        if (!S_ISSOCK(st.st_mode))
                return log_error_errno(EEXIST, "--listen %s: exists and is not a socket (not replaced: "
                                               "choose another path)", path);
        strcpy(sa.sun_path, path);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return 0;
        /* nonblocking: a live listener with a full backlog answers EAGAIN, still live */
        int r = connect(fd, (struct sockaddr *) &sa, sizeof sa);
        int e = errno;
        close(fd);
        if (r == 0 || e == EAGAIN || e == EINPROGRESS)
                return log_error_errno(EADDRINUSE, "--listen %s: another daemon is serving on this "
                                                   "socket; stop it first or choose another path",
                                       path);
        return 0;
}

/* The snapshot folder, before the model load: one asked for (--state-dir, the config) is created
 * when missing (its parent must exist: a mistyped path is not built); the packaged default is
 * systemd's to create (StateDirectory=), never made as a side effect of a run without it. Refused
 * when it is not a folder. Not creatable or not writable: a warning, since the daemon serves
 * without snapshots, and a snapshot then fails with that reason. */
static int check_state_dir(const char *dir, bool asked) {
        struct stat st;

        if (stat(dir, &st) < 0) {
                if (errno == ENOENT && !asked) {
                        log_info("--state-dir %s: missing: snapshots cannot be saved until it exists "
                                 "(--state-dir DIR names another folder)", dir);
                        return 0;
                }
                if (errno == ENOENT && mkdir(dir, 0750) == 0) {
                        log_info("--state-dir %s: created (snapshots are kept there)", dir);
                        return 0;
                }
                log_warning("--state-dir %s: %m: snapshots cannot be saved (--state-dir DIR names "
                            "another folder)", dir);
                return 0;
        }
        if (!S_ISDIR(st.st_mode))
                return log_error_errno(ENOTDIR, "--state-dir %s: exists and is not a folder", dir);
        if (access(dir, W_OK | X_OK) < 0)
                log_warning("--state-dir %s: not writable (%m): snapshots cannot be saved", dir);
        return 0;
}

/* The listening socket: from systemd (socket activation), else bound at --listen. */
static int get_listen_fd(const struct options *o, int *ret, bool *owned, dev_t *ret_dev,
                         ino_t *ret_ino) {
        int n = sd_listen_fds(1);
        if (n < 0)
                return log_error_errno(n, "sd_listen_fds: %s", strerror(-n));
        if (n > 1)
                return log_error_errno(EINVAL, "socket activation passed %d sockets, one expected", n);
        if (n == 1) {
                int fd = SD_LISTEN_FDS_START;
                if (sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) <= 0)
                        return log_error_errno(EINVAL, "socket activation: fd %d is not a listening "
                                                       "AF_UNIX stream socket", fd);
                if (o->listen)
                        log_warning("--listen %s ignored: using the socket systemd passed", o->listen);
                *ret = fd;
                *owned = false;
                return 0;
        }
        if (!o->listen)
                return log_error_errno(EINVAL, "no socket: not socket-activated and no --listen PATH given");
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        if (strlen(o->listen) >= sizeof sa.sun_path)
                return log_error_errno(ENAMETOOLONG, "--listen %s: longer than %zu bytes", o->listen,
                                       sizeof sa.sun_path - 1);
        strcpy(sa.sun_path, o->listen);
        int r = check_listen_free(o->listen);
        if (r < 0)
                return r;
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return log_error_errno(errno, "socket: %m");
        /* a stale socket file from an earlier run (nobody answers on it) would make bind fail */
        struct stat st;
        if (lstat(o->listen, &st) == 0 && S_ISSOCK(st.st_mode))
                (void) unlink(o->listen);
        if (bind(fd, (struct sockaddr *) &sa, sizeof sa) < 0 || listen(fd, 128) < 0) {
                r = log_error_errno(errno, "--listen %s: %m", o->listen);
                close(fd);
                return r;
        }
        /* remember which file is ours: at exit only this one is unlinked, never a socket another
         * daemon bound at the same path since */
        if (lstat(o->listen, &st) == 0) {
                *ret_dev = st.st_dev;
                *ret_ino = st.st_ino;
        }
        *ret = fd;
        *owned = true;
        return 0;
}

/* File descriptors: each connection holds one. Raise the soft limit to the hard one (the
 * default soft 1024 is what makes a flood run out), then keep --max-connections below it with a
 * reserve for everything else (the model, eventfd, epoll, snapshot files, the log): a connection
 * over the limit is told so, instead of accept() failing for everyone. */
#define FD_RESERVE 64
static uint32_t clamp_connections(uint32_t want) {
        struct rlimit rl;

        if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
                return want;
        if (rl.rlim_cur < rl.rlim_max) {
                struct rlimit raised = { rl.rlim_max, rl.rlim_max };
                if (setrlimit(RLIMIT_NOFILE, &raised) == 0)
                        rl = raised;
                else
                        log_warning("cannot raise the open file limit from %llu to %llu: %m",
                                    (unsigned long long) rl.rlim_cur,
                                    (unsigned long long) rl.rlim_max);
        }
        if (rl.rlim_cur == RLIM_INFINITY)
                return want;
        uint64_t room = rl.rlim_cur > 2 * FD_RESERVE ? rl.rlim_cur - FD_RESERVE : rl.rlim_cur / 2;
        if (room < 1)
                room = 1;
        if (want > room) {
                log_warning("--max-connections %u: lowered to %llu, the open file limit is %llu "
                            "and %d descriptors are kept for the daemon itself", want,
                            (unsigned long long) room, (unsigned long long) rl.rlim_cur,
                            (int) (rl.rlim_cur - room));
                return (uint32_t) room;
        }
        return want;
}

static char *model_name(const struct x4_model *m, const char *path) {
        struct gguf_string s;
        if (gguf_get_string(x4_model_gguf(m), "general.name", &s) >= 0 && s.len > 0 && s.len < 256)
                return strndup(s.data, s.len);
        const char *b = strrchr(path, '/');
        return strdup(b ? b + 1 : path);
}

enum {
        OPT_CONFIG = 1000, OPT_MODEL, OPT_CONFIG_JSON, OPT_TOKENIZER, OPT_RELEASE, OPT_DEVICE,
        OPT_THREADS, OPT_LISTEN, OPT_STATE_DIR, OPT_MAX_RUNNING, OPT_MAX_WAITING, OPT_MAX_TOKENS,
        OPT_MAX_FRAME, OPT_MAX_CONN, OPT_PAGE_TOKENS, OPT_CACHE_PAGES, OPT_MEMORY, OPT_PREFILL,
        OPT_GRACE, OPT_LOG_LEVEL, OPT_VERSION, OPT_OUTPUT_BUFFER, OPT_PREFIX_PAGES, OPT_HELLO_TIMEOUT,
        OPT_MAX_MESSAGES, OPT_MAX_SNAPSHOTS, OPT_MAX_SNAPSHOT_BYTES, OPT_SNAPSHOT_CHUNK, OPT_GPU_MEMORY,
        OPT_IDLE_TIMEOUT, OPT_MAX_PENDING, OPT_MAX_TOKENS_LIMIT, OPT_PREFILL_BUDGET, OPT_MTP,
        OPT_MTP_DRAFT, OPT_MTP_SAMPLING, OPT_CPU_MATH,
};

static const struct option longopts[] = {
        { "config", required_argument, NULL, OPT_CONFIG },
        { "model", required_argument, NULL, OPT_MODEL },
        { "config-json", required_argument, NULL, OPT_CONFIG_JSON },
        { "tokenizer-path", required_argument, NULL, OPT_TOKENIZER },
        { "assume-release-defaults", no_argument, NULL, OPT_RELEASE },
        { "device", required_argument, NULL, OPT_DEVICE },
        { "threads", required_argument, NULL, OPT_THREADS },
        { "listen", required_argument, NULL, OPT_LISTEN },
        { "state-dir", required_argument, NULL, OPT_STATE_DIR },
        { "max-running", required_argument, NULL, OPT_MAX_RUNNING },
        { "max-waiting", required_argument, NULL, OPT_MAX_WAITING },
        { "max-tokens", required_argument, NULL, OPT_MAX_TOKENS },
        { "max-frame", required_argument, NULL, OPT_MAX_FRAME },
        { "max-connections", required_argument, NULL, OPT_MAX_CONN },
        { "page-tokens", required_argument, NULL, OPT_PAGE_TOKENS },
        { "cache-pages", required_argument, NULL, OPT_CACHE_PAGES },
        { "memory-limit", required_argument, NULL, OPT_MEMORY },
        { "gpu-memory-limit", required_argument, NULL, OPT_GPU_MEMORY },
        { "prefill-chunk", required_argument, NULL, OPT_PREFILL },
        { "prefix-pages", required_argument, NULL, OPT_PREFIX_PAGES },
        { "grace", required_argument, NULL, OPT_GRACE },
        { "hello-timeout", required_argument, NULL, OPT_HELLO_TIMEOUT },
        { "idle-timeout", required_argument, NULL, OPT_IDLE_TIMEOUT },
        { "max-pending-bytes", required_argument, NULL, OPT_MAX_PENDING },
        { "max-tokens-limit", required_argument, NULL, OPT_MAX_TOKENS_LIMIT },
        { "prefill-budget", required_argument, NULL, OPT_PREFILL_BUDGET },
        { "max-messages", required_argument, NULL, OPT_MAX_MESSAGES },
        { "max-snapshots", required_argument, NULL, OPT_MAX_SNAPSHOTS },
        { "max-snapshot-bytes", required_argument, NULL, OPT_MAX_SNAPSHOT_BYTES },
        { "snapshot-chunk", required_argument, NULL, OPT_SNAPSHOT_CHUNK },
        { "output-buffer", required_argument, NULL, OPT_OUTPUT_BUFFER },
        { "log-level", required_argument, NULL, OPT_LOG_LEVEL },
        { "mtp", required_argument, NULL, OPT_MTP },
        { "mtp-draft", required_argument, NULL, OPT_MTP_DRAFT },
        { "mtp-sampling", required_argument, NULL, OPT_MTP_SAMPLING },
        { "cpu-math", required_argument, NULL, OPT_CPU_MATH },
        { "help", no_argument, NULL, 'h' },
        { "version", no_argument, NULL, OPT_VERSION },
        {}
};

/* Two passes: the first finds --config (and --help/--version), the second applies the flags
 * over the config. Returns 1 when the program should exit 0 (help/version). */
static int parse_args(int argc, char **argv, struct options *o) {
        const char *config = NULL;
        int c, r;

        opterr = 1;
        while ((c = getopt_long(argc, argv, "h", longopts, NULL)) >= 0) {
                if (c == 'h') {
                        help();
                        return 1;
                }
                if (c == OPT_VERSION) {
                        printf("xing4d " XING4D_VERSION "\n");
                        return 1;
                }
                if (c == OPT_CONFIG)
                        config = optarg;
                if (c == '?')
                        return log_error_errno(EINVAL, "bad command line (see xing4d --help)");
        }
        if (optind < argc)
                return log_error_errno(EINVAL, "unexpected argument '%s' (see xing4d --help)",
                                       argv[optind]);
        o->config_file = config ? config : DEFAULT_CONFIG;
        r = load_config(o, o->config_file, config != NULL);
        if (r < 0)
                return r;
        optind = 0; /* 0: GNU getopt re-initialises (permutation, not the "+" of the global pass) */
        while ((c = getopt_long(argc, argv, "h", longopts, NULL)) >= 0) {
                if (c == OPT_CONFIG)
                        continue;
                if (c == OPT_RELEASE) {
                        o->assume_release_defaults = true;
                        continue;
                }
                const char *name = NULL;
                for (const struct option *l = longopts; l->name; l++)
                        if (l->val == c)
                                name = l->name;
                if (!name)
                        continue;
                char where[64];
                snprintf(where, sizeof where, "--%s", name);
                r = apply_option(o, name, optarg, where);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* The backend --device asks for: cuda, cpu, or auto (the CUDA module when it loads and finds a
 * device, else the CPU, saying which and why). 0, or -errno with the reason logged and in the
 * unit's status. The backends log their own failures as they happen and hand the reason back
 * as a value (why). */
static int start_backend(const struct x4_model *model, const char *device, enum mtp_mode mtp,
                         struct x4_backend_params *bp, const struct x4_backend_ops **ops,
                         struct x4_backend **backend) {
        char why[1024] = "";
        int r = 0;
        bool has_nextn = x4_model_weights(model)->has_nextn;

        if (streq(device, "auto") || streq(device, "cuda")) {
                bool cuda = streq(device, "cuda");
                r = x4_backend_get("cuda", ops, why, sizeof why);
                bool loaded = r >= 0;
                if (r >= 0) {
                        bp->cache_type = X4_CACHE_F16;
                        /* auto: no GPU is expected too, not an error worth a red line; the
                         * reason goes in the info line below */
                        int level = log_get_max_level();
                        if (!cuda)
                                log_set_max_level(MIN(level, LOG_CRIT));
                        bp->mtp = mtp == MTP_ON || (mtp == MTP_AUTO && has_nextn);
                        r = (*ops)->create(model, bp, backend, why, sizeof why);
                        /* auto: the block is a speed-up, not a requirement; without it the
                         * card may still hold the model (its weights and cache layer are
                         * 3% of the release's bytes) */
                        if (r < 0 && mtp == MTP_AUTO && bp->mtp) {
                                log_info("mtp auto: the cuda backend did not start with the NextN "
                                         "block (%s); trying without it", why);
                                bp->mtp = false;
                                r = (*ops)->create(model, bp, backend, why, sizeof why);
                        }
                        log_set_max_level(level);
                }
                if (r < 0 && cuda) {
                        if (!loaded) /* the module's own failures are logged by the module */
                                log_error("%s", why);
                        (void) sd_notifyf(0, "STATUS=failed: %s", why);
                        return r;
                }
                /* --mtp on where the GPU cannot run the NextN block: say so, do not fall back
                 * to a CPU decode many times slower */
                if (r == -EOPNOTSUPP && loaded && mtp == MTP_ON) {
                        log_error("%s", why);
                        (void) sd_notifyf(0, "STATUS=failed: %s", why);
                        return r;
                }
                /* say which backend auto chose and why, so "why is it slow" has an answer */
                if (r < 0)
                        log_info("device auto: %s: %s; using cpu",
                                 loaded ? "cuda backend failed to start" : "cuda module not loadable",
                                 why);
                else if (!cuda)
                        log_info("device auto: cuda module loaded and started; using cuda");
        }
        if (!*backend) {
                bp->cache_type = X4_CACHE_F32;
                bp->mtp = mtp == MTP_ON;
                r = x4_backend_get("cpu", ops, why, sizeof why);
                if (r >= 0)
                        r = (*ops)->create(model, bp, backend, why, sizeof why);
                if (r < 0) {
                        (void) sd_notifyf(0, "STATUS=failed: %s", why);
                        return r;
                }
        }
        if (mtp == MTP_AUTO)
                log_info("mtp auto: %s", bp->mtp ? "on (cuda backend, the model has a NextN block)" :
                         !has_nextn ? "off (the model has no NextN block)" :
                         *ops && streq((*ops)->name, "cpu") ? "off (cpu backend: drafting is slower there; --mtp on forces it)" :
                         "off");
        return 0;
}

int main(int argc, char **argv) {
        struct options o = { .grace_s = 30.0, .hello_timeout_s = 10.0, .idle_timeout_s = 600.0, .page_tokens = 256,
                             .max_tokens = MAX_TOKENS_DEFAULT, .mtp_draft = 1, .log_level = LOG_INFO,
                             .max_waiting = 256, .cpu_math = X4_CPU_MATH_FAST };
        _cleanup_(x4_model_freep) struct x4_model *model = NULL;
        struct tokenizer *tok = NULL;
        const struct x4_backend_ops *ops = NULL;
        struct x4_backend *backend = NULL;
        struct sched *sched = NULL;
        struct server *server = NULL;
        _cleanup_free_ char *name = NULL;
        char backend_name[160];
        int listen_fd = -1, r, ret = EXIT_FAILURE;
        bool listen_owned = false;
        dev_t listen_dev = 0;
        ino_t listen_ino = 0;

        log_set_ident("xing4d");
        signal(SIGPIPE, SIG_IGN);
        r = parse_args(argc, argv, &o);
        if (r != 0) {
                options_free(&o);
                return r > 0 ? EXIT_SUCCESS : EXIT_FAILURE;
        }
        log_set_max_level(o.log_level);
        if (!o.model) {
                /* Nothing configured: the demo model when its package is installed, else an error
                 * naming both places a model could have come from. */
                if (access(X4_DEFAULT_MODEL, R_OK) < 0) {
                        log_error("no model: none configured (--model PATH, or model = PATH in %s) and the "
                                  "default %s cannot be read (%m; the xing4d-demo-model package installs it)",
                                  o.config_file, X4_DEFAULT_MODEL);
                        goto out;
                }
                o.model = strdup(X4_DEFAULT_MODEL);
                if (!o.model) {
                        log_error_errno(ENOMEM, "out of memory");
                        goto out;
                }
                log_info("no model configured (--model, or model = in %s): serving the default %s",
                         o.config_file, X4_DEFAULT_MODEL);
        }
        /* --listen on a live daemon's socket, or no socket at all: say so now, not after loading
         * the model (minutes for the release's) */
        if (!o.listen && sd_listen_fds(0) <= 0) {
                log_error("no socket: not socket-activated and no --listen PATH given");
                goto out;
        }
        if (o.listen && sd_listen_fds(0) <= 0 && check_listen_free(o.listen) < 0)
                goto out;
        if (check_state_dir(o.state_dir ? o.state_dir : "/var/lib/xing4d", o.state_dir != NULL) < 0)
                goto out;
        /* SIGTERM during the load: the default action (exit) is right, nothing is served yet.
         * SIGHUP is logged and ignored once serving (libevent's handler); during the load (minutes
         * for the release's file) its default action would end the daemon without a word, so it
         * is ignored until then. */
        (void) signal(SIGHUP, SIG_IGN);
        (void) sd_notifyf(0, "STATUS=loading %s", o.model);
        struct x4_model_params mp = {
                .path = o.model,
                .config_path = o.config_json,
                .tokenizer_dir = o.tokenizer_path,
                .assume_release_defaults = o.assume_release_defaults,
        };
        char why[1024] = ""; /* the reader logs its reasons as it goes; the status gets one */
        r = x4_model_open(&mp, &model, why, sizeof why);
        if (r < 0) {
                (void) sd_notifyf(0, "STATUS=failed: %s", why);
                goto out;
        }
        name = model_name(model, o.model);
        r = tokenizer_new_from_gguf(x4_model_gguf(model), &tok, why, sizeof why);
        if (r < 0) {
                log_warning("%s: no usable tokenizer (%s): only token-id prompts will be served",
                            o.model, why);
                tok = NULL;
        }

        const char *device = o.device ? o.device : "auto";
        struct progress_state ps = { .last_pct = -1, .base = 0.0, .scale = 0.5 };
        read_weights(model, &ps);
        ps.base = 0.5;
        struct x4_backend_params bp = {
                .n_threads = o.threads,
                .page_tokens = o.page_tokens,
                .n_pages = o.cache_pages,
                .cache_type = X4_CACHE_F32,
                .memory_limit = o.memory_limit,
                .cpu_math = o.cpu_math,
                .progress = load_progress,
                .progress_userdata = &ps,
                .log = x4_backend_params_default_log,
        };
        r = start_backend(model, device, o.mtp, &bp, &ops, &backend);
        if (r < 0)
                goto out;
        struct x4_backend_caps caps;
        ops->caps(backend, &caps);
        snprintf(backend_name, sizeof backend_name, "%s", caps.name ? caps.name : ops->name);

        struct sched_params sp = {
                .model = model,
                .ops = ops,
                .backend = backend,
                .tokenizer = tok,
                .max_running = o.max_running,
                .max_waiting = o.max_waiting ? o.max_waiting : SCHED_NO_QUEUE, /* 0: no queue */
                .max_tokens_default = o.max_tokens,
                .max_tokens_limit = o.max_tokens_limit,
                .prefill_budget = o.prefill_budget,
                .prefill_chunk = o.prefill_chunk,
                .state_dir = o.state_dir ? o.state_dir : "/var/lib/xing4d",
                .prefix_pages = o.prefix_pages,
                .max_messages = o.max_messages,
                .max_snapshots = o.max_snapshots,
                .max_snapshot_bytes = o.max_snapshot_bytes,
                .snapshot_chunk = o.snapshot_chunk,
                .mtp_draft = bp.mtp ? o.mtp_draft : 0,
                .mtp_match = o.mtp_match,
        };
        r = sched_new(&sp, &sched);
        if (r < 0)
                goto out;
        r = sched_start(sched);
        if (r < 0)
                goto out;

        r = get_listen_fd(&o, &listen_fd, &listen_owned, &listen_dev, &listen_ino);
        if (r < 0)
                goto out;

        const struct x4_config *cfg = x4_model_config(model);
        struct server_params sv = {
                .listen_fd = listen_fd,
                .sched = sched,
                .max_frame = o.max_frame ? o.max_frame : FRAME_MAX_DEFAULT,
                .max_connections = clamp_connections(o.max_connections ? o.max_connections : 1024),
                .grace_s = o.grace_s,
                .hello_timeout_s = o.hello_timeout_s,
                .idle_timeout_s = o.idle_timeout_s,
                .max_pending_bytes = o.max_pending_bytes,
                .output_high_water = (uint32_t) o.output_buffer,
                .server_version = "xing4d " XING4D_VERSION,
                .model = {
                        .architecture = "xing4_0",
                        .name = name,
                        .fingerprint = x4_model_fingerprint(model),
                        .backend = backend_name,
                        .model_path = o.model,
                        .config_source = x4_model_config_source(model),
                        .n_vocab = cfg->n_vocab,
                        .n_ctx = sched_context_limit(sched),
                        .n_layer = cfg->n_layer,
                        .n_embd = cfg->n_embd,
                        .n_expert = cfg->n_expert,
                        .n_expert_used = cfg->n_expert_used,
                        .bos_id = cfg->bos_id,
                        .eos_id = cfg->eos_id,
                        .has_tokenizer = tok != NULL,
                },
        };
        r = server_new(&sv, &server);
        if (r < 0)
                goto out;
        log_info("serving %s (%s) on %s%s: %u cache pages of %u tokens, context %u tokens", name,
                 o.model, backend_name,
                 streq(backend_name, "cpu") && o.cpu_math == X4_CPU_MATH_FAST ? " (fast numerics)" : "",
                 caps.n_pages, caps.page_tokens, sched_context_limit(sched));
        (void) sd_notifyf(0, "READY=1\nSTATUS=serving %s on %s", name, backend_name);
        r = server_run(server);
        if (r >= 0)
                ret = EXIT_SUCCESS;
out:
        server_free(server);
        sched_free(sched);
        if (backend)
                ops->destroy(backend);
        tokenizer_free(tok);
        if (listen_fd >= 0 && listen_owned) {
                struct stat st;
                close(listen_fd);
                /* only the socket this daemon bound: not one another daemon put there since */
                if (o.listen && lstat(o.listen, &st) == 0 && st.st_dev == listen_dev &&
                    st.st_ino == listen_ino)
                        (void) unlink(o.listen);
        }
        options_free(&o);
        return ret;
}
