/* SPDX-License-Identifier: MIT */
/* Named snapshots: the file format, loading (prep thread), saving in chunks (pages copied out by
 * the engine thread, written by the prep thread), listing and dropping (any thread). */
#include "engine/internal.h"

/* ---- snapshot files ------------------------------------------------------------------------ */

/* state_dir/NAME.x4snap: this header, the token ids, then the cache pages as the backend's
 * page_read() gives them. Native byte order: a snapshot belongs to the daemon build and model
 * (fingerprint) that wrote it.
 *
 * Version 2 (chat snapshots) puts struct snap_header_v2 right after the header, and its
 * meta_bytes of JSON after the token ids, before the pages. A version 1 file (written before) is
 * read as a raw snapshot: its tokens precede any request's prompt, as they always did. */
#define SNAP_MAGIC "X4SNAP1\n"
#define SNAP_VERSION 2u
struct snap_header {
        char magic[8];
        uint32_t version;
        uint32_t page_tokens;
        uint64_t page_bytes;
        uint32_t n_tokens;
        uint32_t n_pages;
        uint64_t created_unix;
        char fingerprint[64];
};

enum snap_kind {
        SNAP_RAW = 0,  /* text or token ids (or a finished request): a token prefix */
        SNAP_CHAT = 1, /* chat messages rendered without the generation prompt: a conversation
                        * prefix; the JSON holds {"messages": [...], "tools_json": "..."} */
};

struct snap_header_v2 {
        uint32_t kind;       /* enum snap_kind */
        uint32_t meta_bytes; /* SNAP_CHAT: the conversation's JSON (no NUL); SNAP_RAW: 0 */
        uint64_t reserved[3];
};

/* the most JSON a snapshot's conversation may take (the frame limit bounds what a client sends) */
#define SNAP_META_MAX ((uint32_t) 256 << 20)

static void snap_path(const struct sched *s, const char *name, char *buf, size_t size,
                      const char *suffix) {
        snprintf(buf, size, "%s/%s.x4snap%s", s->p.state_dir, name, suffix);
}

static int read_full(int fd, void *buf, size_t n) {
        uint8_t *p = buf;
        while (n > 0) {
                ssize_t r = read(fd, p, n);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r <= 0)
                        return r < 0 ? -errno : -EIO;
                p += r;
                n -= (size_t) r;
        }
        return 0;
}

static int write_full(int fd, const void *buf, size_t n) {
        const uint8_t *p = buf;
        while (n > 0) {
                ssize_t r = write(fd, p, n);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r < 0)
                        return -errno;
                p += r;
                n -= (size_t) r;
        }
        return 0;
}

/* Read and check a header; code + message on failure. */
/* The state directory, opened once per operation: every file of the operation is then opened,
 * renamed and unlinked relative to it (openat & co), so the directory cannot be swapped for
 * another in the middle of an operation. */
static int snap_dir_open(const struct sched *s, int *ret, char *err, size_t size) {
        int dfd = open(s->p.state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return errno == ENOENT ? SCHED_ERR_NOT_FOUND
                                       : eng_verr(err, size, SCHED_ERR_INTERNAL, "state directory %s: %s",
                                              s->p.state_dir, strerror(errno));
        *ret = dfd;
        return 0;
}

static int snap_open(const struct sched *s, int dfd, const char *name, struct snap_header *h,
                     struct snap_header_v2 *x, int *ret_fd, char *err, size_t size) {
        char path[4096], file[96];
        snap_path(s, name, path, sizeof path, "");
        snprintf(file, sizeof file, "%s.x4snap", name);
        int own = -1;
        if (dfd < 0) {
                int code = snap_dir_open(s, &own, err, size);
                if (code == SCHED_ERR_NOT_FOUND)
                        return eng_verr(err, size, SCHED_ERR_NOT_FOUND, "snapshot '%s': not found in %s",
                                    name, s->p.state_dir);
                if (code)
                        return code;
                dfd = own;
        }
        /* O_NOFOLLOW: a symlink planted at NAME.x4snap must not make the daemon read (or, for
         * drop, judge) a file elsewhere with its privileges; O_NONBLOCK: nor hang on a FIFO */
        int fd = openat(dfd, file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (own >= 0) {
                int e = errno;
                close(own);
                errno = e;
        }
        if (fd < 0)
                return errno == ENOENT ? eng_verr(err, size, SCHED_ERR_NOT_FOUND,
                                              "snapshot '%s': not found in %s", name, s->p.state_dir)
                       : errno == ELOOP ? eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                                              "snapshot %s: a symbolic link, not followed", path)
                                        : eng_verr(err, size, SCHED_ERR_INTERNAL, "snapshot %s: %s",
                                               path, strerror(errno));
        struct stat st;
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
                close(fd);
                return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                            "snapshot %s: not a regular file", path);
        }
        memset(x, 0, sizeof *x); /* version 1: a raw snapshot */
        if (read_full(fd, h, sizeof *h) < 0 || memcmp(h->magic, SNAP_MAGIC, 8) != 0 ||
            h->version < 1 || h->version > SNAP_VERSION ||
            (h->version >= 2 && read_full(fd, x, sizeof *x) < 0)) {
                close(fd);
                return eng_verr(err, size, SCHED_ERR_INTERNAL,
                            "snapshot %s: not a version 1 or 2 xing4d snapshot file", path);
        }
        if (x->kind > SNAP_CHAT || (x->kind == SNAP_CHAT) != (x->meta_bytes > 0) ||
            x->meta_bytes > SNAP_META_MAX) {
                close(fd);
                return eng_verr(err, size, SCHED_ERR_INTERNAL,
                            "snapshot %s: kind %u with %u bytes of conversation, a raw snapshot (0) "
                            "without or a chat one (1) with at most %u expected", path, x->kind,
                            x->meta_bytes, SNAP_META_MAX);
        }
        h->fingerprint[sizeof h->fingerprint - 1] = 0;
        *ret_fd = fd;
        return 0;
}

/* Load a snapshot for resuming into j: its tokens become the start of j's sequence. */
int eng_snap_load(struct sched *s, struct job *j, int32_t **ret_tokens, char *err, size_t size) {
        const char *name = j->r->snapshot;
        struct snap_header h;
        struct snap_header_v2 x;
        int fd, code;
        size_t pb = s->p.ops->page_bytes(s->p.backend);

        code = snap_open(s, -1, name, &h, &x, &fd, err, size);
        if (code)
                return code;
        if (strcmp(h.fingerprint, x4_model_fingerprint(s->p.model)) != 0) {
                close(fd);
                return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                            "snapshot '%s': made with model %s, this daemon serves %s", name,
                            h.fingerprint, x4_model_fingerprint(s->p.model));
        }
        if (h.page_tokens != kvcache_page_tokens(s->kv) || h.page_bytes != pb) {
                close(fd);
                return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                            "snapshot '%s': pages of %u tokens / %llu bytes, this cache has %u / %zu",
                            name, h.page_tokens, (unsigned long long) h.page_bytes,
                            kvcache_page_tokens(s->kv), pb);
        }
        if (h.n_tokens == 0 || h.n_pages != kvcache_pages_for(s->kv, h.n_tokens) ||
            h.n_tokens >= s->ctx_limit) {
                close(fd);
                return eng_verr(err, size, SCHED_ERR_INVALID_ARGUMENT,
                            "snapshot '%s': %u tokens in %u pages does not fit this cache", name,
                            h.n_tokens, h.n_pages);
        }
        int32_t *tokens = malloc((size_t) h.n_tokens * sizeof *tokens);
        uint8_t *data = malloc((size_t) h.n_pages * pb);
        char *meta = x.meta_bytes ? malloc((size_t) x.meta_bytes + 1) : NULL;
        if (!tokens || !data || (x.meta_bytes && !meta) ||
            read_full(fd, tokens, (size_t) h.n_tokens * sizeof *tokens) < 0 ||
            (meta && read_full(fd, meta, x.meta_bytes) < 0) ||
            read_full(fd, data, (size_t) h.n_pages * pb) < 0) {
                free(tokens);
                free(data);
                free(meta);
                close(fd);
                return eng_verr(err, size, SCHED_ERR_INTERNAL, "snapshot '%s': truncated or unreadable",
                            name);
        }
        close(fd);
        if (meta)
                meta[x.meta_bytes] = 0;
        j->snap_n = h.n_tokens;
        j->snap_data = data;
        j->snap_pages = h.n_pages;
        free(j->snap_meta);
        j->snap_meta = meta;
        *ret_tokens = tokens;
        return 0;
}

/* Snapshots are written on behalf of any client that can connect: a count and a byte quota keep
 * them from filling the disk. Replacing a snapshot of the same name counts its old size out. */
static int snap_check_quota(const struct sched *s, const char *name, uint64_t bytes, char *err,
                            size_t size) {
        struct sched_snapshot_info *a = NULL;
        size_t n = 0, count = 0;
        uint64_t total = 0;
        int code = sched_snapshot_list(s, &a, &n, err, size);
        if (code)
                return code;
        for (size_t i = 0; i < n; i++) {
                if (streq(a[i].name, name))
                        continue;
                count++;
                total += a[i].bytes;
        }
        free(a);
        if (count + 1 > s->p.max_snapshots)
                return eng_verr(err, size, SCHED_ERR_RESOURCE_EXHAUSTED,
                            "snapshot '%s': %zu snapshots exist, limit %u (max-snapshots): drop one "
                            "first", name, count, s->p.max_snapshots);
        if (total + bytes > s->p.max_snapshot_bytes)
                return eng_verr(err, size, SCHED_ERR_RESOURCE_EXHAUSTED,
                            "snapshot '%s': %llu bytes more would bring the snapshots to %llu bytes, "
                            "limit %llu (max-snapshot-bytes)", name, (unsigned long long) bytes,
                            (unsigned long long) (total + bytes),
                            (unsigned long long) s->p.max_snapshot_bytes);
        return 0;
}

static int snap_exists_error(const struct sched *s, const char *name, char *err, size_t size) {
        return eng_verr(err, size, SCHED_ERR_ALREADY_EXISTS,
                        "snapshot '%s': already exists in %s; drop it first, or ask to replace it "
                        "(x4ctl snapshot create --replace)", name, s->p.state_dir);
}

int eng_snap_check_absent(const struct sched *s, const char *name, char *err, size_t size) {
        char file[96];
        struct stat st;
        int dfd = -1;
        int code = snap_dir_open(s, &dfd, err, size);
        if (code == SCHED_ERR_NOT_FOUND)
                return 0; /* made on the first save */
        if (code)
                return code;
        snprintf(file, sizeof file, "%s.x4snap", name);
        int r = fstatat(dfd, file, &st, AT_SYMLINK_NOFOLLOW);
        int e = errno;
        close(dfd);
        if (r == 0)
                return snap_exists_error(s, name, err, size);
        if (e != ENOENT)
                return eng_verr(err, size, SCHED_ERR_INTERNAL, "snapshot %s/%s: %s", s->p.state_dir, file,
                                strerror(e));
        return 0;
}

/* tmpfile to file in dfd; without replace, never over an existing file (EEXIST), atomically. */
static int snap_publish(int dfd, const char *tmpfile, const char *file, bool replace) {
        if (replace)
                return renameat(dfd, tmpfile, dfd, file) < 0 ? -errno : 0;
        if (renameat2(dfd, tmpfile, dfd, file, RENAME_NOREPLACE) == 0)
                return 0;
        if (errno != EINVAL && errno != ENOSYS)
                return -errno;
        /* a file system without RENAME_NOREPLACE: link() refuses an existing name too */
        if (linkat(dfd, tmpfile, dfd, file, 0) < 0)
                return -errno;
        (void) unlinkat(dfd, tmpfile, 0);
        return 0;
}

/* The size of the file a create job writes. */
static uint64_t snap_file_bytes(const struct sched *s, const struct job *j) {
        size_t pb = s->p.ops->page_bytes(s->p.backend);
        return sizeof(struct snap_header) + sizeof(struct snap_header_v2) +
               (uint64_t) j->n_prompt * sizeof *j->seq + (j->snap_meta ? strlen(j->snap_meta) : 0) +
               (uint64_t) kvcache_pages_for(s->kv, j->n_prompt) * pb;
}

/* j (a create job) has prefilled its whole prompt: write its pages. */
static void snap_tmpfile(const struct job *j, char *buf, size_t size) {
        snprintf(buf, size, "%s.x4snap.tmp", j->r->snapshot_create);
}

/* A half-written snapshot file (an error, a cancel at shutdown): closed and its .tmp unlinked. */
void eng_snap_abandon(struct job *j) {
        char tmpfile[100];

        if (j->snap_fd < 0)
                return;
        close(j->snap_fd);
        snap_tmpfile(j, tmpfile, sizeof tmpfile);
        (void) unlinkat(j->snap_dfd, tmpfile, 0);
        close(j->snap_dfd);
        j->snap_fd = j->snap_dfd = -1;
}

/* Open NAME.x4snap.tmp and write the header and the tokens (prep thread). */
static int snap_begin(struct sched *s, struct job *j, char *err, size_t size) {
        char tmp[4096], tmpfile[100];
        size_t pb = s->p.ops->page_bytes(s->p.backend);
        uint32_t n_pages = kvcache_pages_for(s->kv, j->n_prompt);
        struct snap_header h = { .version = SNAP_VERSION, .page_tokens = kvcache_page_tokens(s->kv),
                                 .page_bytes = pb, .n_tokens = j->n_prompt, .n_pages = n_pages,
                                 .created_unix = (uint64_t) time(NULL) };
        size_t meta_bytes = j->snap_meta ? strlen(j->snap_meta) : 0;
        struct snap_header_v2 x = { .kind = j->snap_meta ? SNAP_CHAT : SNAP_RAW,
                                    .meta_bytes = (uint32_t) meta_bytes };
        const char *name = j->r->snapshot_create;

        memcpy(h.magic, SNAP_MAGIC, 8);
        snprintf(h.fingerprint, sizeof h.fingerprint, "%s", x4_model_fingerprint(s->p.model));
        snap_path(s, name, tmp, sizeof tmp, ".tmp");
        snap_tmpfile(j, tmpfile, sizeof tmpfile);
        if (meta_bytes > SNAP_META_MAX)
                return eng_verr(err, size, SCHED_ERR_TOO_LARGE,
                            "snapshot '%s': a conversation of %zu bytes, at most %u can be kept", name,
                            meta_bytes, SNAP_META_MAX);
        int code = snap_check_quota(s, name, snap_file_bytes(s, j), err, size);
        if (code)
                return code;
        int dfd = -1; /* set by snap_dir_open on success; gcc 12 -O3 cannot see it */
        code = snap_dir_open(s, &dfd, err, size);
        if (code == SCHED_ERR_NOT_FOUND)
                return eng_verr(err, size, SCHED_ERR_INTERNAL, "state directory %s: %s",
                            s->p.state_dir, strerror(ENOENT));
        if (code)
                return code;
        /* O_EXCL | O_NOFOLLOW: never write through a file or symlink someone put at the tmp
         * name; a stale tmp of ours (a crash mid-write) is unlinked (the link, not its target) */
        int fd = openat(dfd, tmpfile, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640);
        if (fd < 0 && errno == EEXIST && unlinkat(dfd, tmpfile, 0) == 0)
                fd = openat(dfd, tmpfile, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640);
        if (fd < 0) {
                int e = errno;
                close(dfd);
                return eng_verr(err, size, SCHED_ERR_INTERNAL, "snapshot %s: %s", tmp, strerror(e));
        }
        j->snap_fd = fd;
        j->snap_dfd = dfd;
        j->snap_written = 0;
        int r = write_full(fd, &h, sizeof h);
        if (r >= 0)
                r = write_full(fd, &x, sizeof x);
        if (r >= 0)
                r = write_full(fd, j->seq, (size_t) j->n_prompt * sizeof *j->seq);
        if (r >= 0 && meta_bytes)
                r = write_full(fd, j->snap_meta, meta_bytes);
        if (r < 0) {
                eng_snap_abandon(j);
                return eng_verr(err, size, SCHED_ERR_INTERNAL, "snapshot %s: %s", tmp, strerror(-r));
        }
        return 0;
}

/* Append the chunk in snap_data; after the last page, close the file and rename it into place,
 * filling j->saved (prep thread). */
int eng_snap_write_chunk(struct sched *s, struct job *j, char *err, size_t size) {
        char path[4096], file[96], tmpfile[100];
        size_t pb = s->p.ops->page_bytes(s->p.backend);
        uint32_t n_pages = kvcache_pages_for(s->kv, j->n_prompt);
        const char *name = j->r->snapshot_create;
        int code, r;

        if (j->snap_fd < 0 && (code = snap_begin(s, j, err, size)))
                return code;
        snap_path(s, name, path, sizeof path, "");
        r = write_full(j->snap_fd, j->snap_data, (size_t) j->snap_chunk * pb);
        if (r < 0) {
                eng_snap_abandon(j);
                return eng_verr(err, size, SCHED_ERR_INTERNAL, "snapshot %s: %s", path, strerror(-r));
        }
        j->snap_written += j->snap_chunk;
        if (j->snap_written < n_pages)
                return 0;
        snprintf(file, sizeof file, "%s.x4snap", name);
        snap_tmpfile(j, tmpfile, sizeof tmpfile);
        r = close(j->snap_fd) < 0 ? -errno : 0;
        j->snap_fd = -1;
        /* with replace, rename replaces whatever is at NAME.x4snap, a planted symlink included,
         * never its target; without it, an existing name (one another create took since this
         * one was accepted) is refused */
        if (r >= 0)
                r = snap_publish(j->snap_dfd, tmpfile, file, j->r->snapshot_replace);
        if (r < 0)
                (void) unlinkat(j->snap_dfd, tmpfile, 0);
        close(j->snap_dfd);
        j->snap_dfd = -1;
        if (r == -EEXIST)
                return snap_exists_error(s, name, err, size);
        if (r < 0)
                return eng_verr(err, size, SCHED_ERR_INTERNAL, "snapshot %s: %s", path, strerror(-r));
        memset(&j->saved, 0, sizeof j->saved);
        snprintf(j->saved.name, sizeof j->saved.name, "%s", name);
        j->saved.n_tokens = j->n_prompt;
        j->saved.bytes = snap_file_bytes(s, j);
        j->saved.created_unix = (uint64_t) time(NULL);
        return 0;
}

int sched_snapshot_list(const struct sched *s, struct sched_snapshot_info **ret, size_t *n,
                        char *err, size_t size) {
        struct sched_snapshot_info *a = NULL;
        size_t k = 0, cap = 0;

        if (!s->p.state_dir)
                return eng_verr(err, size, SCHED_ERR_UNAVAILABLE, "this daemon has no state directory");
        DIR *d = opendir(s->p.state_dir);
        if (!d) {
                if (errno == ENOENT) {
                        *ret = calloc(1, sizeof **ret);
                        *n = 0;
                        return *ret ? 0 : eng_verr(err, size, SCHED_ERR_INTERNAL, "out of memory");
                }
                return eng_verr(err, size, SCHED_ERR_INTERNAL, "%s: %s", s->p.state_dir, strerror(errno));
        }
        for (struct dirent *de; (de = readdir(d));) {
                size_t len = strlen(de->d_name);
                char name[72], e2[8];
                struct snap_header h;
                struct snap_header_v2 x;
                int fd;
                struct stat st;
                if (len <= 7 || strcmp(de->d_name + len - 7, ".x4snap") != 0 || len - 7 >= sizeof name)
                        continue;
                memcpy(name, de->d_name, len - 7);
                name[len - 7] = 0;
                if (sched_snapshot_check_name(name, e2, sizeof e2) != 0 ||
                    snap_open(s, dirfd(d), name, &h, &x, &fd, e2, sizeof e2) != 0)
                        continue;
                if (fstat(fd, &st) < 0)
                        st.st_size = 0;
                close(fd);
                if (eng_grow((void **) &a, &cap, k + 1, sizeof *a) < 0) {
                        closedir(d);
                        free(a);
                        return eng_verr(err, size, SCHED_ERR_INTERNAL, "out of memory");
                }
                memset(&a[k], 0, sizeof a[k]);
                snprintf(a[k].name, sizeof a[k].name, "%s", name);
                a[k].n_tokens = h.n_tokens;
                a[k].bytes = (uint64_t) st.st_size;
                a[k].created_unix = h.created_unix;
                k++;
        }
        closedir(d);
        if (!a && !(a = calloc(1, sizeof *a)))
                return eng_verr(err, size, SCHED_ERR_INTERNAL, "out of memory");
        *ret = a;
        *n = k;
        return 0;
}

int sched_snapshot_drop(const struct sched *s, const char *name, struct sched_snapshot_info *ret,
                        char *err, size_t size) {
        struct snap_header h;
        struct snap_header_v2 x;
        struct stat st;
        char path[4096];
        int fd, code;

        code = sched_snapshot_check_name(name, err, size);
        if (code)
                return code;
        if (!s->p.state_dir)
                return eng_verr(err, size, SCHED_ERR_UNAVAILABLE, "this daemon has no state directory");
        int dfd = -1; /* set by snap_dir_open on success; gcc 12 -O3 cannot see it */
        code = snap_dir_open(s, &dfd, err, size);
        if (code == SCHED_ERR_NOT_FOUND)
                return eng_verr(err, size, SCHED_ERR_NOT_FOUND, "snapshot '%s': not found in %s", name,
                            s->p.state_dir);
        if (code)
                return code;
        char file[96];
        snprintf(file, sizeof file, "%s.x4snap", name);
        code = snap_open(s, dfd, name, &h, &x, &fd, err, size);
        if (code == SCHED_ERR_INTERNAL && fstatat(dfd, file, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISREG(st.st_mode)) {
                /* a regular file under the name that is not a snapshot (truncated, overwritten):
                 * it can be dropped too, or the name could never be used again */
                memset(&h, 0, sizeof h);
                code = 0;
                fd = -1;
        }
        if (code) {
                close(dfd);
                return code;
        }
        if (fd >= 0) {
                if (fstat(fd, &st) < 0)
                        st.st_size = 0;
                close(fd);
        }
        snap_path(s, name, path, sizeof path, "");
        int u = unlinkat(dfd, file, 0) < 0 ? errno : 0;
        close(dfd);
        if (u)
                return eng_verr(err, size, SCHED_ERR_INTERNAL, "snapshot %s: %s", path, strerror(u));
        memset(ret, 0, sizeof *ret);
        snprintf(ret->name, sizeof ret->name, "%s", name);
        ret->n_tokens = h.n_tokens;
        ret->bytes = (uint64_t) st.st_size;
        ret->created_unix = h.created_unix;
        return 0;
}

void eng_snapshot_done(struct sched *s, struct job *j, const struct sched_snapshot_info *info) {
        log_info("snapshot '%s': %u tokens saved (%llu bytes, %s)", info->name, info->n_tokens,
                 (unsigned long long) info->bytes,
                 j->snap_meta ? "a chat conversation" : "raw tokens");
        eng_unlink_job(s, j);
        eng_job_release(s, j);
        struct sched_event *e = calloc(1, sizeof *e);
        if (e) {
                e->kind = SCHED_EVENT_SNAPSHOT;
                e->cookie = j->r->cookie;
                e->id = j->r->id;
                e->snapshot = *info;
                eng_push_event(s, e, true);
        } else
                log_error("scheduler: out of memory reporting snapshot '%s'", info->name);
        eng_job_free(s, j);
}

void eng_prep_enqueue(struct sched *s, struct job *j);

/* Creating a snapshot: the engine thread copies the pages out of the cache a chunk of at most
 * --snapshot-chunk bytes (default this) at a time (a fast copy), the prep thread appends it to the file (the slow part)
 * while the running streams go on; the next chunk is copied when the last one is written, so a
 * snapshot of any size needs one chunk of memory and never stalls the engine on the disk. The
 * request keeps its cache pages until the last chunk is copied. */

void eng_finish_snapshot(struct sched *s, struct job *j) {
        size_t pb = s->p.ops->page_bytes(s->p.backend);
        uint32_t n_pages = kvcache_pages_for(s->kv, j->n_prompt);
        uint32_t per = (uint32_t) MAX((uint64_t) 1, s->p.snapshot_chunk / pb);
        uint32_t first = j->snap_written, k = MIN(per, n_pages - first);
        uint8_t *data = malloc(MAX((size_t) k, (size_t) 1) * pb);
        char err[256] = "";
        int r = data ? 0 : -ENOMEM;

        for (uint32_t i = 0; r >= 0 && i < k; i++)
                r = s->p.ops->page_read(s->p.backend, j->pages[first + i], data + (size_t) i * pb,
                                        err, sizeof err);
        if (r < 0) {
                bool oom = !data;
                free(data);
                eng_snap_abandon(j);
                eng_fail_job(s, j, SCHED_ERR_INTERNAL, "snapshot '%s': %s%s", j->r->snapshot_create,
                             oom ? "out of memory" : "reading the cache failed: ", err);
                return;
        }
        free(j->snap_data);
        j->snap_data = data;
        j->snap_chunk = k;
        if (first + k == n_pages)
                eng_job_release(s, j); /* its pages are free for others while the rest is written */
        j->state = JOB_SAVING;
        eng_prep_enqueue(s, j);
}

