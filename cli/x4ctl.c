/* SPDX-License-Identifier: MIT */
/* x4ctl: the command-line client of xing4d, built on libx4client only (no daemon internals), so
 * it is also the reference for what the public API can do. */
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <jansson.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "x4client.h"
#include "common/escape.h"
#include "common/macro.h"
#include "common/util.h"

#define X4CTL_VERSION "0.1.0"

static bool streq_(const char *a, const char *b) {
        return strcmp(a, b) == 0;
}

/* Exit codes (documented in --help). */
enum {
        EXIT_OK = 0,
        EXIT_FAIL = 1,        /* the server refused the request or failed */
        EXIT_USAGE = 2,       /* bad command line */
        EXIT_CONNECT = 3,     /* daemon not reachable */
        EXIT_TIMEOUT = 4,
        EXIT_NOT_FOUND = 5,   /* snapshot / request id unknown */
        EXIT_UNAVAILABLE = 6, /* daemon draining or full */
        EXIT_NO_ANSWER = 7,   /* no answer: the output budget ran out, or the turn ended, while the model was thinking */
        EXIT_EXISTS = 8,      /* snapshot create: the name is taken (no --replace) */
        EXIT_INTERRUPTED = 130,
};

static struct {
        const char *socket;
        int connect_ms, response_ms;
        bool json;
} arg = { .connect_ms = 30000, .response_ms = 300000 };

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
        (void) sig;
        interrupted = 1;
}

static int exit_code_of(int e) {
        switch (e) {
        case X4_OK: return EXIT_OK;
        case X4_E_CONNECT: return EXIT_CONNECT;
        case X4_E_TIMEOUT: return EXIT_TIMEOUT;
        case X4_E_NOT_FOUND: return EXIT_NOT_FOUND;
        case X4_E_UNAVAILABLE: return EXIT_UNAVAILABLE;
        case X4_E_ALREADY_EXISTS: return EXIT_EXISTS;
        default: return EXIT_FAIL;
        }
}

static int fail_client(x4_client *c, int e) {
        fprintf(stderr, "x4ctl: %s\n", c ? x4_client_last_error(c) : x4_strerror(e));
        return exit_code_of(e);
}

_printf_(1, 2) static int usage_error(const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "x4ctl: ");
        vfprintf(stderr, fmt, ap);
        fprintf(stderr, " (see x4ctl --help)\n");
        va_end(ap);
        return EXIT_USAGE;
}

/* Text for the daemon must be UTF-8 (the protocol's strings are): 0, or a usage error naming
 * `what` and the first byte that is not. */
static int check_utf8(const char *what, const char *s, size_t len) {
        size_t at = utf8_invalid_at(s, len);
        if (at == len)
                return 0;
        return usage_error("%s is not UTF-8 text (0x%02x at byte %zu; convert it first, e.g. with "
                           "iconv -f latin1 -t utf-8)", what, (unsigned) (unsigned char) s[at], at);
}

/* May the caller (effective ids, supplementary groups) do `want` (S_IW or S_IX as a bit of the
 * "other" triple: 2 or 1) to a file of this owner, group and mode? Root may unless nobody may
 * search (x). */
static bool may_access(const struct stat *st, unsigned want, uid_t uid, gid_t gid, const gid_t *groups,
                       int n_groups) {
        unsigned mode = (unsigned) st->st_mode;
        if (uid == 0)
                return want != 1 || (mode & 0111);
        if (uid == st->st_uid)
                return (mode >> 6) & want;
        bool member = gid == st->st_gid;
        for (int i = 0; !member && i < n_groups; i++)
                member = groups[i] == st->st_gid;
        return member ? (mode >> 3) & want : mode & want;
}

/* A user's or group's name, or "uid N" / "gid N" when it has none. */
static const char *id_name(bool group, unsigned id, char *buf, size_t size) {
        struct passwd *pw = group ? NULL : getpwuid((uid_t) id);
        struct group *gr = group ? getgrgid((gid_t) id) : NULL;
        const char *name = pw ? pw->pw_name : gr ? gr->gr_name : NULL;
        if (name)
                snprintf(buf, size, "%s", name);
        else
                snprintf(buf, size, "%s %u", group ? "gid" : "uid", id);
        return buf;
}

/* Connecting to path was refused (EACCES): who may connect, from what stat() says of the socket
 * and the folders above it, and how to become one of them. Connecting needs search (x) on every
 * folder of the path and write on the socket. */
static void permission_hint(const char *path) {
        uid_t uid = geteuid();
        gid_t gid = getegid(), groups[256];
        int n_groups = getgroups(ELEMENTSOF(groups), groups);
        char u[64], g[64], me[64];
        struct stat st;

        if (n_groups < 0)
                n_groups = 0;
        id_name(false, uid, me, sizeof me);
        /* a folder on the way that the caller may not search */
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s", path);
        for (char *p = dir + 1; (p = strchr(p, '/')); p++) {
                *p = 0;
                bool closed = stat(dir, &st) == 0 && S_ISDIR(st.st_mode) &&
                              !may_access(&st, 1, uid, gid, groups, n_groups);
                if (closed) {
                        fprintf(stderr, "x4ctl: hint: the folder %s (owner %s, group %s, mode %04o) is closed to "
                                        "%s, so the socket %s in it is out of reach: run x4ctl as %s, or have "
                                        "xing4d listen in a folder open to you (the packaged socket is %s)\n",
                                dir, id_name(false, st.st_uid, u, sizeof u), id_name(true, st.st_gid, g, sizeof g),
                                (unsigned) (st.st_mode & 07777), me, path, u, X4_DEFAULT_SOCKET);
                        return;
                }
                *p = '/';
        }
        if (stat(path, &st) < 0 || may_access(&st, 2, uid, gid, groups, n_groups)) {
                /* the permissions allow it: a security module (AppArmor, SELinux) said no */
                fprintf(stderr, "x4ctl: hint: %s's permissions let %s connect, so something else refused it "
                                "(a security module such as AppArmor or SELinux? see the system log)\n",
                        path, me);
                return;
        }
        id_name(false, st.st_uid, u, sizeof u);
        id_name(true, st.st_gid, g, sizeof g);
        if (st.st_mode & S_IWGRP)
                fprintf(stderr, "x4ctl: hint: %s (owner %s, group %s, mode %04o) is for members of the group %s: "
                                "sudo usermod -aG %s %s, then log in again (or run x4ctl as a member)\n",
                        path, u, g, (unsigned) (st.st_mode & 07777), g, g, me);
        else
                /* xing4d --listen has no option for the socket's mode: it follows xing4d's umask */
                fprintf(stderr, "x4ctl: hint: %s is owned by %s (group %s), mode %04o: only %s can connect. Run "
                                "x4ctl as %s, or open the socket to a group: the packaged xing4d.socket makes it "
                                "group xing4, mode 0660 (its SocketGroup=, SocketMode=); a socket of xing4d "
                                "--listen takes xing4d's umask (e.g. umask 007 before starting it, or chgrp GROUP "
                                "and chmod 0660 the socket once it listens)\n",
                        path, u, g, (unsigned) (st.st_mode & 07777), u, u);
}

/* What to do about a connection that failed, after the library's own message. */
static void connect_hint(int e, const char *msg) {
        const char *path = arg.socket ? arg.socket : getenv(X4_SOCKET_ENV);
        if (!path || !*path)
                path = X4_DEFAULT_SOCKET;
        struct stat st;
        const char *what = NULL;
        if (stat(path, &st) == 0 && !S_ISSOCK(st.st_mode))
                what = S_ISDIR(st.st_mode) ? "is a folder, not a socket" : "is a file, not a socket";
        else if (e == X4_E_PROTOCOL)
                what = "is another program's socket, not xing4d's";
        if (what)
                fprintf(stderr, "x4ctl: hint: %s %s: pass --socket PATH with the path xing4d listens on "
                                "(its --listen; the packaged one is %s)\n", path, what, X4_DEFAULT_SOCKET);
        else if (strstr(msg, "Permission denied"))
                permission_hint(path);
        else if (strstr(msg, "No such file") || strstr(msg, "Connection refused"))
                fprintf(stderr, "x4ctl: hint: is xing4d running? Start it with: sudo systemctl start xing4d.socket "
                                "(or pass --socket PATH / set $X4_SOCKET to where it listens)\n");
}

static void json_str(FILE *f, const char *s, size_t n);

static int open_client(x4_client **ret) {
        x4_client *c;
        int e = x4_client_new(&c);
        if (e < 0) {
                fprintf(stderr, "x4ctl: %s\n", x4_strerror(e));
                return exit_code_of(e);
        }
        x4_client_set_name(c, "x4ctl " X4CTL_VERSION);
        x4_client_set_timeouts(c, arg.connect_ms, arg.response_ms);
        e = x4_client_connect(c, arg.socket);
        if (e < 0) {
                if (arg.json) { /* --json: every failure is one error object on stdout too */
                        const char *m = x4_client_last_error(c);
                        printf("{\"type\":\"error\",\"code\":\"%s\",\"message\":", x4_strerror(e));
                        json_str(stdout, m, strlen(m));
                        printf("}\n");
                        fflush(stdout);
                }
                int code = fail_client(c, e);
                if (e == X4_E_CONNECT || e == X4_E_PROTOCOL)
                        connect_hint(e, x4_client_last_error(c));
                /* a peer that does not speak the protocol (the library says so): no daemon there
                 * to talk to, as for a missing socket */
                if (e == X4_E_PROTOCOL)
                        code = EXIT_CONNECT;
                x4_client_free(c);
                return code;
        }
        *ret = c;
        return 0;
}

/* ---- JSON output ---------------------------------------------------------------------------- */

static void json_str(FILE *f, const char *s, size_t n) {
        fputc('"', f);
        for (size_t i = 0; i < n; i++) {
                unsigned char ch = (unsigned char) s[i];
                switch (ch) {
                case '"': fputs("\\\"", f); break;
                case '\\': fputs("\\\\", f); break;
                case '\n': fputs("\\n", f); break;
                case '\r': fputs("\\r", f); break;
                case '\t': fputs("\\t", f); break;
                default:
                        if (ch < 0x20)
                                fprintf(f, "\\u%04x", ch);
                        else
                                fputc(ch, f);
                }
        }
        fputc('"', f);
}

static const char *channel_name(int ch) {
        switch (ch) {
        case X4_CHANNEL_REASONING: return "reasoning";
        case X4_CHANNEL_TOOL_CALL: return "tool_call";
        default: return "content";
        }
}

static const char *finish_name(int f) {
        switch (f) {
        case X4_FINISH_STOP: return "stop";
        case X4_FINISH_LENGTH: return "length";
        case X4_FINISH_CANCELLED: return "cancelled";
        case X4_FINISH_TOOL_CALLS: return "tool_calls";
        default: return "error";
        }
}

/* ---- number parsing ------------------------------------------------------------------------- */

/* A finite float: -EINVAL for no number, -EDOM for nan or inf, -ERANGE for one beyond a float's
 * range (a value too small for one is taken as the float nearest to it). */
static int parse_float(const char *s, float *ret) {
        char *end;
        errno = 0;
        if (!s || !*s)
                return -EINVAL;
        float v = strtof(s, &end);
        if (end == s || *end)
                return -EINVAL;
        if (errno == ERANGE && isinf(v))
                return -ERANGE;
        if (!isfinite(v))
                return -EDOM;
        *ret = v;
        return 0;
}

/* The message for a float option's value that parse_float refused with r. */
static int float_error(const char *opt, const char *value, int r) {
        return usage_error("%s: '%s' is %s", opt, value,
                           r == -ERANGE ? "out of the range of a float (about 3.4e38)"
                           : r == -EDOM ? "not a finite number"
                                        : "not a number");
}

/* "1,2,3" or "1 2 3" (blanks around a comma allowed). -EINVAL: no ids, or *bad_item (1-based; 0
 * for none) is no token id; -ENODATA: item *bad_item is empty (two commas in a row, or a comma at
 * either end: a typo more likely than a list meant that way). */
static int parse_ids(const char *s, int32_t **ret, size_t *n, size_t *bad_item) {
        size_t cap = 16, k = 0;
        int32_t *a = malloc(cap * sizeof *a);
        bool after_comma = true; /* the list's start counts as one: a leading comma is an empty item */
        if (!a)
                return -ENOMEM;
        *bad_item = 0;
        for (const char *p = s[strspn(s, ", \t\n")] ? s : "";;) { /* only separators: no ids */
                p += strspn(p, " \t\n");
                if (*p == ',' || (!*p && after_comma && k)) {
                        if (after_comma) {
                                *bad_item = k + 1;
                                free(a);
                                return -ENODATA;
                        }
                        after_comma = true;
                        p++;
                        continue;
                }
                if (!*p)
                        break;
                size_t len = strcspn(p, ", \t\n");
                char item[32];
                int32_t v;
                snprintf(item, sizeof item, "%.*s", (int) MIN(len, sizeof item - 1), p);
                if (len >= sizeof item || parse_i32(item, &v) < 0 || v < 0) {
                        *bad_item = k + 1;
                        free(a);
                        return -EINVAL;
                }
                if (k == cap) {
                        int32_t *b = realloc(a, (cap *= 2) * sizeof *a);
                        if (!b) {
                                free(a);
                                return -ENOMEM;
                        }
                        a = b;
                }
                a[k++] = v;
                after_comma = false;
                p += len;
        }
        if (k == 0) {
                free(a);
                return -EINVAL;
        }
        *ret = a;
        *n = k;
        return 0;
}

/* All of f, NUL-terminated (its length in *len): NULL with errno set when reading failed (stdin
 * closed, a folder) or memory ran out. */
static char *read_all(FILE *f, size_t *len) {
        size_t cap = 4096, n = 0;
        char *b = malloc(cap);
        if (!b)
                return NULL;
        for (;;) {
                if (n + 1 >= cap) {
                        char *nb = realloc(b, cap *= 2);
                        if (!nb) {
                                free(b);
                                return NULL;
                        }
                        b = nb;
                }
                size_t r = fread(b + n, 1, cap - n - 1, f);
                n += r;
                if (r == 0)
                        break;
        }
        if (ferror(f)) {
                int e = errno ? errno : EIO;
                free(b);
                errno = e;
                return NULL;
        }
        b[n] = 0;
        if (len)
                *len = n;
        return b;
}

/* The text of PROMPT...: argv[first..argc) joined by single spaces, or all of stdin when `first`
 * is argc; NULL when out of memory. */
static char *prompt_text(int argc, char **argv, int first) {
        if (first >= argc)
                return read_all(stdin, NULL);
        size_t len = 0;
        for (int i = first; i < argc; i++)
                len += strlen(argv[i]) + 1;
        char *prompt = calloc(1, len + 1);
        for (int i = first; prompt && i < argc; i++) {
                if (i > first)
                        strcat(prompt, " ");
                strcat(prompt, argv[i]);
        }
        return prompt;
}

/* PROMPT... or stdin into *ret: 0, or an exit status after saying why (no prompt, stdin
 * unreadable, a NUL byte or bytes not UTF-8 in it, out of memory). optional: an empty or blank
 * stdin is no prompt (0 with *ret NULL). */
static int read_prompt(int argc, char **argv, int first, bool raw, bool optional, char **ret) {
        size_t n = 0;
        char *p;
        if (first >= argc) {
                errno = 0;
                p = read_all(stdin, &n);
                if (!p && errno == EINTR && interrupted)
                        return EXIT_INTERRUPTED; /* Ctrl-C before the prompt was whole: nothing sent */
                if (!p && errno != ENOMEM) {
                        fprintf(stderr, "x4ctl: cannot read the prompt on stdin: %s (give the prompt as "
                                        "arguments, or text on stdin)\n", strerror(errno));
                        return EXIT_USAGE;
                }
                if (p && strlen(p) != n) {
                        size_t at = strlen(p);
                        free(p);
                        return usage_error("the prompt on stdin holds a NUL byte (at byte %zu): text expected", at);
                }
        } else
                p = prompt_text(argc, argv, first);
        if (!p) {
                fprintf(stderr, "x4ctl: out of memory\n");
                return EXIT_FAIL;
        }
        int r = check_utf8(first >= argc ? "the prompt on stdin" : "the prompt", p, strlen(p));
        if (r) {
                free(p);
                return r;
        }
        /* raw text is sent as it is, blanks included; a chat message needs words */
        if (!p[0] || (!raw && !p[strspn(p, " \t\r\n")])) {
                bool empty = !p[0];
                free(p);
                if (optional && first >= argc) {
                        *ret = NULL;
                        return 0;
                }
                if (first >= argc)
                        return usage_error("no prompt: stdin %s (give the prompt as arguments or on stdin)",
                                           empty ? "was empty" : "held only blanks");
                return usage_error("%s", "no prompt: the prompt given is blank");
        }
        *ret = p;
        return 0;
}

/* The prompt into req: as raw text, or as a user message after the optional system one. */
static void request_prompt(x4_request *req, const char *prompt, bool raw, const char *system) {
        if (raw)
                x4_request_set_text(req, prompt);
        else {
                if (system)
                        x4_request_add_message(req, "system", system);
                if (prompt) /* NULL: a system-only conversation (snapshot create --system) */
                        x4_request_add_message(req, "user", prompt);
        }
}

/* --tokens LIST into req: 0, or the usage error's exit status when LIST is not token ids. */
static int request_tokens(x4_request *req, const char *tokens) {
        int32_t *ids;
        size_t n, bad;
        int r = parse_ids(tokens, &ids, &n, &bad);
        if (r == -ENOMEM) {
                fprintf(stderr, "x4ctl: out of memory\n");
                return EXIT_FAIL;
        }
        if (r == -ENODATA)
                return usage_error("--tokens: item %zu is empty (two commas in a row, or a comma at the "
                                   "start or end of the list)", bad);
        if (r < 0 && bad) {
                const char *t = tokens;
                for (size_t i = 1;; i++) { /* the bad item's text, for the message */
                        t += strspn(t, ", \t\n");
                        if (i == bad)
                                break;
                        t += strcspn(t, ", \t\n");
                }
                return usage_error("--tokens: item %zu, '%.*s', is not a token id (0 to %d; the list is "
                                   "ids separated by commas or blanks)", bad, (int) MIN(strcspn(t, ", \t\n"), 64),
                                   t, INT32_MAX);
        }
        if (r < 0)
                return usage_error("--tokens: '%s' holds no token ids (1,2,3 expected)", tokens);
        x4_request_set_tokens(req, ids, n);
        free(ids);
        return 0;
}

/* ---- generate / chat ------------------------------------------------------------------------ */

/* Options shared by generate and chat. */
struct gen_opts {
        x4_request *req;
        const char *system;
        const char *tokens;
        bool raw;
        bool show_think;
        bool json_schema; /* --json-schema: the answer must be complete to be valid */
        const char *json_schema_path; /* its FILE, to name it in the daemon's errors */
        bool logprobs;    /* --logprobs N > 0 */
        int thinking; /* -1 default */
};

enum {
        OPT_TEMPERATURE = 1000, OPT_TOP_P, OPT_TOP_K, OPT_MIN_P, OPT_SEED, OPT_REP, OPT_PRES,
        OPT_FREQ, OPT_MAX_TOKENS, OPT_STOP, OPT_STOP_ID, OPT_SNAPSHOT, OPT_LOGPROBS,
        OPT_THINK_BUDGET, OPT_IGNORE_EOS, OPT_NO_MTP, OPT_SYSTEM, OPT_NO_THINK, OPT_SHOW_THINK, OPT_TOKENS,
        OPT_RAW, OPT_REPLACE, OPT_JSON, OPT_WATCH, OPT_SOCKET, OPT_CONNECT_TIMEOUT, OPT_TIMEOUT, OPT_REQUESTS,
        OPT_FROM_REQUEST, OPT_JSON_SCHEMA,
};

static const struct option gen_longopts[] = {
        { "temperature", required_argument, NULL, OPT_TEMPERATURE },
        { "top-p", required_argument, NULL, OPT_TOP_P },
        { "top-k", required_argument, NULL, OPT_TOP_K },
        { "min-p", required_argument, NULL, OPT_MIN_P },
        { "seed", required_argument, NULL, OPT_SEED },
        { "repetition-penalty", required_argument, NULL, OPT_REP },
        { "presence-penalty", required_argument, NULL, OPT_PRES },
        { "frequency-penalty", required_argument, NULL, OPT_FREQ },
        { "max-tokens", required_argument, NULL, OPT_MAX_TOKENS },
        { "stop", required_argument, NULL, OPT_STOP },
        { "stop-id", required_argument, NULL, OPT_STOP_ID },
        { "snapshot", required_argument, NULL, OPT_SNAPSHOT },
        { "logprobs", required_argument, NULL, OPT_LOGPROBS },
        { "thinking-budget", required_argument, NULL, OPT_THINK_BUDGET },
        { "ignore-eos", no_argument, NULL, OPT_IGNORE_EOS },
        { "no-mtp", no_argument, NULL, OPT_NO_MTP },
        { "system", required_argument, NULL, OPT_SYSTEM },
        { "no-think", no_argument, NULL, OPT_NO_THINK },
        { "show-think", no_argument, NULL, OPT_SHOW_THINK },
        { "tokens", required_argument, NULL, OPT_TOKENS },
        { "raw", no_argument, NULL, OPT_RAW },
        { "json", no_argument, NULL, OPT_JSON },
        { "json-schema", required_argument, NULL, OPT_JSON_SCHEMA },
        {}
};

/* --json-schema FILE: the answer constrained to the JSON Schema in FILE, checked here (a JSON
 * object) so a typo in the file is named before anything is sent. */
static int set_json_schema(x4_request *req, const char *path) {
        json_error_t je;
        struct stat st;
        /* jansson reads a folder as an empty file: "'[' or '{' expected near end of file" */
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
                fprintf(stderr, "x4ctl: --json-schema %s: a folder; a file holding a JSON Schema expected\n", path);
                return EXIT_USAGE;
        }
        json_t *schema = json_load_file(path, 0, &je);
        if (!schema) {
                /* jansson has no position for a file it could not open or read (line -1) */
                if (je.line > 0)
                        fprintf(stderr, "x4ctl: --json-schema %s: %s (line %d, column %d)\n", path, je.text,
                                je.line, je.column);
                else
                        fprintf(stderr, "x4ctl: --json-schema %s: %s\n", path, je.text);
                return EXIT_USAGE;
        }
        if (!json_is_object(schema)) {
                fprintf(stderr, "x4ctl: --json-schema %s: a JSON Schema object ({\"type\": \"object\", ...}) "
                                "expected\n", path);
                json_decref(schema);
                return EXIT_USAGE;
        }
        char *text = json_dumps(schema, JSON_COMPACT);
        json_decref(schema);
        int e = text ? x4_request_set_constraint(req, X4_CONSTRAINT_JSON_SCHEMA, text) : X4_E_NOMEM;
        free(text);
        if (e < 0) {
                fprintf(stderr, "x4ctl: %s\n", x4_strerror(e));
                return EXIT_FAIL;
        }
        return 0;
}

/* Parse generate/chat options. Returns 0, or an exit code. */
static int parse_gen_opts(int argc, char **argv, struct gen_opts *o) {
        int c;
        o->thinking = -1;
        o->req = x4_request_new();
        if (!o->req) {
                fprintf(stderr, "x4ctl: out of memory\n");
                return EXIT_FAIL;
        }
        optind = 0; /* 0: GNU getopt re-initialises (permutation, not the "+" of the global pass) */
        while ((c = getopt_long(argc, argv, "", gen_longopts, NULL)) >= 0) {
                float f;
                int r;
                uint32_t u;
                uint64_t u64;
                int32_t i;
                switch (c) {
/* a float option in the daemon's range (proto/xing4.proto SamplingParams), checked here so a
 * value out of it is a usage error naming the option, as for the other numbers */
#define FLOAT_OPT(ID, setter, name, in_range, what)                                                \
        case ID:                                                                                   \
                if ((r = parse_float(optarg, &f)) < 0)                                             \
                        return float_error("--" name, optarg, r);                                  \
                if (!(in_range))                                                                   \
                        return usage_error("--" name ": '%s' is not " what, optarg);               \
                setter(o->req, f);                                                                 \
                break;
                        FLOAT_OPT(OPT_TEMPERATURE, x4_request_set_temperature, "temperature",
                                  f >= 0 && f <= 100, "a temperature from 0 (greedy) to 100")
                        FLOAT_OPT(OPT_TOP_P, x4_request_set_top_p, "top-p", f > 0 && f <= 1,
                                  "a probability above 0 and at most 1")
                        FLOAT_OPT(OPT_MIN_P, x4_request_set_min_p, "min-p", f >= 0 && f < 1,
                                  "a probability from 0 to below 1")
                        FLOAT_OPT(OPT_REP, x4_request_set_repetition_penalty, "repetition-penalty",
                                  f > 0 && f <= 10, "a factor above 0 and at most 10 (1: off)")
                        FLOAT_OPT(OPT_PRES, x4_request_set_presence_penalty, "presence-penalty",
                                  f >= -2 && f <= 2, "a penalty from -2 to 2")
                        FLOAT_OPT(OPT_FREQ, x4_request_set_frequency_penalty, "frequency-penalty",
                                  f >= -2 && f <= 2, "a penalty from -2 to 2")
#undef FLOAT_OPT
/* an integer option: parse_fn into var, then setter; what the value is, for the message */
#define INT_OPT(ID, parse_fn, var, setter, name, what)                                             \
        case ID:                                                                                   \
                if (parse_fn(optarg, &var) < 0)                                                    \
                        return usage_error("--" name ": '%s' is not " what, optarg);               \
                setter(o->req, var);                                                               \
                break;
                        INT_OPT(OPT_TOP_K, parse_u32, u, x4_request_set_top_k, "top-k",
                                "a count from 0 to 4294967295")
                case OPT_MAX_TOKENS: /* the daemon refuses 0 too; say so before connecting */
                        if (parse_u32(optarg, &u) < 0 || u == 0)
                                return usage_error("--max-tokens: '%s' is not a count from 1 to 4294967295", optarg);
                        x4_request_set_max_tokens(o->req, u);
                        break;
                case OPT_STOP_ID:
                        if (parse_uint(optarg, 10, INT32_MAX, &u64) < 0)
                                return usage_error("--stop-id: '%s' is not a token id from 0 to %d", optarg,
                                                   INT32_MAX);
                        x4_request_add_stop_id(o->req, (int32_t) u64);
                        break;
                case OPT_LOGPROBS:
                        if (parse_u32(optarg, &u) < 0)
                                return usage_error("--logprobs: '%s' is not a count from 0 to 4294967295", optarg);
                        x4_request_set_logprobs(o->req, u);
                        o->logprobs = u > 0;
                        break;
#undef INT_OPT
                case OPT_THINK_BUDGET: /* -1 is the daemon's "no limit"; below it is refused there too */
                        if (parse_i32(optarg, &i) < 0 || i < -1)
                                return usage_error("--thinking-budget: '%s' is not a token count from 0 to "
                                                   "2147483647, or -1 for no limit", optarg);
                        x4_request_set_thinking_budget(o->req, i);
                        break;
                case OPT_SEED:
                        if (parse_u64(optarg, &u64) < 0)
                                return usage_error("--seed: '%s' is not an unsigned integer from 0 to "
                                                   "18446744073709551615", optarg);
                        x4_request_set_seed(o->req, u64);
                        break;
                case OPT_STOP:
                        if (!*optarg) /* it would match everywhere */
                                return usage_error("--stop: %s", "an empty stop string would match everywhere");
                        if ((r = check_utf8("--stop", optarg, strlen(optarg))))
                                return r;
                        x4_request_add_stop(o->req, optarg);
                        break;
                case OPT_SNAPSHOT:
                        x4_request_set_snapshot(o->req, optarg);
                        break;
                case OPT_IGNORE_EOS:
                        x4_request_set_ignore_eos(o->req, true);
                        break;
                case OPT_NO_MTP:
                        x4_request_set_no_mtp(o->req, true);
                        break;
                case OPT_SYSTEM:
                        if ((r = check_utf8("--system", optarg, strlen(optarg))))
                                return r;
                        o->system = optarg;
                        break;
                case OPT_NO_THINK:
                        o->thinking = 0;
                        break;
                case OPT_SHOW_THINK:
                        o->show_think = true;
                        break;
                case OPT_TOKENS:
                        o->tokens = optarg;
                        break;
                case OPT_RAW:
                        o->raw = true;
                        break;
                case OPT_JSON:
                        arg.json = true;
                        break;
                case OPT_JSON_SCHEMA:
                        r = set_json_schema(o->req, optarg);
                        if (r)
                                return r;
                        o->json_schema = true;
                        o->json_schema_path = optarg;
                        break;
                default:
                        return EXIT_USAGE;
                }
        }
        return 0;
}

/* What follows a chat answer cut by Ctrl-C in the history sent with the next turns. */
#define CHAT_CUT_MARK "[interrupted by the user]"

struct gen_state {
        bool show_think;
        bool json;
        int last_channel;
        bool any_output;
        bool any_content;  /* an answer (content or a tool call) came */
        bool no_think;     /* --no-think: reasoning the model emits anyway is not a budget problem */
        bool json_schema;  /* --json-schema: an answer cut by the budget is not valid JSON */
        const char *json_schema_path; /* --json-schema FILE */
        bool output_gone;  /* stdout is closed (x4ctl generate | head): the request is cancelled */
        char *reply;   /* chat: the assistant's content, for the history */
        size_t reply_len;
        bool chat;      /* a chat turn: a cancelled answer stays in the history, marked */
        bool cancelled; /* the request ended with finish_reason cancelled */
        bool conn_lost; /* the connection broke (the daemon gone): nothing more can be sent */
        bool refused;   /* the request alone failed (the daemon's Error for it, or too large to
                         * send); the connection is still good for the next one */
        int error;      /* the enum x4_error the request failed with, 0 if none */
        bool progress_tty;   /* stderr is a terminal: show a long prefill's progress there */
        bool progress_shown; /* a progress line is on the terminal, to be cleared */
};

/* A long prompt's prefill: a line on the terminal (rewritten in place, cleared by the first
 * output), and in --json a {"type":"progress"} line. */
static void on_progress(uint64_t request_id, uint32_t done, uint32_t total, void *userdata) {
        struct gen_state *s = userdata;
        if (s->json) {
                printf("{\"type\":\"progress\",\"done_tokens\":%u,\"total_tokens\":%u}\n", done,
                       total);
                fflush(stdout);
        }
        if (s->progress_tty) {
                fprintf(stderr, "\r\033[Kprompt: %u of %u tokens (%u%%)", done, total,
                        total ? (unsigned) ((uint64_t) done * 100 / total) : 0);
                fflush(stderr);
                s->progress_shown = true;
        }
}

static void clear_progress(struct gen_state *s) {
        if (s->progress_shown) {
                fputs("\r\033[K", stderr);
                fflush(stderr);
                s->progress_shown = false;
        }
}

static int on_chunk(const struct x4_chunk *ch, void *userdata) {
        struct gen_state *s = userdata;

        clear_progress(s);

        if (s->json) {
                printf("{\"type\":\"chunk\",\"channel\":\"%s\",\"text\":", channel_name(ch->channel));
                json_str(stdout, ch->text, ch->text_len);
                printf(",\"token_ids\":[");
                for (size_t i = 0; i < ch->n_token_ids; i++)
                        printf("%s%" PRId32, i ? "," : "", ch->token_ids[i]);
                printf("]");
                if (ch->tool_name) {
                        printf(",\"tool_call\":{\"name\":");
                        json_str(stdout, ch->tool_name, strlen(ch->tool_name));
                        /* arguments are a JSON object already */
                        printf(",\"arguments\":%s}",
                               ch->tool_arguments_json ? ch->tool_arguments_json : "{}");
                }
                if (ch->n_logprobs) {
                        printf(",\"logprobs\":[");
                        for (size_t i = 0; i < ch->n_logprobs; i++) {
                                const struct x4_token_logprob *l = &ch->logprobs[i];
                                printf("%s{\"token_id\":%" PRId32 ",\"logprob\":%.6g,\"top\":[",
                                       i ? "," : "", l->token_id, (double) l->logprob);
                                for (size_t j = 0; j < l->n_top; j++) {
                                        printf("%s{\"token_id\":%" PRId32 ",\"logprob\":%.6g",
                                               j ? "," : "", l->top[j].token_id,
                                               (double) l->top[j].logprob);
                                        if (l->top[j].text) {
                                                printf(",\"text\":");
                                                json_str(stdout, l->top[j].text,
                                                         strlen(l->top[j].text));
                                        }
                                        printf("}");
                                }
                                printf("]}");
                        }
                        printf("]");
                }
                printf("}\n");
        } else if (ch->channel == X4_CHANNEL_REASONING) {
                /* reasoning goes to stderr so stdout stays the answer (pipe-friendly) */
                if (s->show_think) {
                        fwrite(ch->text, 1, ch->text_len, stderr);
                        fflush(stderr);
                }
        } else if (ch->tool_name) {
                printf("[tool call] %s %s\n", ch->tool_name,
                       ch->tool_arguments_json ? ch->tool_arguments_json : "{}");
        } else {
                if (s->show_think && s->last_channel == X4_CHANNEL_REASONING)
                        fputc('\n', stderr);
                fwrite(ch->text, 1, ch->text_len, stdout);
                s->any_output = ch->text_len > 0 || s->any_output;
        }
        if (ch->channel == X4_CHANNEL_CONTENT && ch->text_len) {
                char *n = realloc(s->reply, s->reply_len + ch->text_len + 1);
                if (n) {
                        memcpy(n + s->reply_len, ch->text, ch->text_len);
                        s->reply_len += ch->text_len;
                        n[s->reply_len] = 0;
                        s->reply = n;
                }
        }
        if ((ch->channel == X4_CHANNEL_CONTENT && ch->text_len) || ch->tool_name)
                s->any_content = true;
        s->last_channel = ch->channel;
        /* the reader went away (EPIPE: SIGPIPE is ignored for the daemon's socket): cancel the
         * request instead of generating into the void up to --max-tokens */
        if (fflush(stdout) == EOF || ferror(stdout)) {
                s->output_gone = true;
                return 1;
        }
        return 0; /* Ctrl-C is handled by run_generate's loop, also while no chunk comes */
}

static void print_done(const struct x4_done *d) {
        printf("{\"type\":\"done\",\"finish_reason\":\"%s\",\"server_request_id\":%" PRIu64
               ",\"usage\":{\"prompt_tokens\":%u,\"cached_tokens\":%u,\"completion_tokens\":%u,"
               "\"reasoning_tokens\":%u},\"timings\":{\"queue_ms\":%.3f,\"prefill_ms\":%.3f,"
               "\"decode_ms\":%.3f,\"total_ms\":%.3f}",
               finish_name(d->finish_reason), d->server_request_id, d->prompt_tokens,
               d->cached_tokens, d->completion_tokens, d->reasoning_tokens, d->queue_ms,
               d->prefill_ms, d->decode_ms, d->total_ms);
        if (d->stop) {
                printf(",\"stop\":");
                json_str(stdout, d->stop, strlen(d->stop));
        }
        printf("}\n");
}

/* The daemon names a field of the protocol in its errors ("sampling.temperature: -1 is out of
 * range [0, 100]"), which API clients rely on; x4ctl's user set it with an option, so x4ctl says
 * the option. Fields one option fills (an index into a list an option builds is said as the
 * option's count: "--stop number 2", "--tokens: item 2"); others are left as they are. */
static const struct {
        const char *field, *option;
} option_fields[] = {
        { "sampling.temperature", "--temperature" },
        { "sampling.top_p", "--top-p" },
        { "sampling.top_k", "--top-k" },
        { "sampling.min_p", "--min-p" },
        { "sampling.seed", "--seed" },
        { "sampling.repetition_penalty", "--repetition-penalty" },
        { "sampling.presence_penalty", "--presence-penalty" },
        { "sampling.frequency_penalty", "--frequency-penalty" },
        { "max_tokens", "--max-tokens" },
        { "logprobs", "--logprobs" },
        { "thinking_budget", "--thinking-budget" },
        { "stop", "--stop" },
        { "stop_ids", "--stop-id" }, /* its message names the id: no index needed */
        { "prompt.tokens", "--tokens" },
};

static bool field_is(const char *msg, size_t n, const char *field) {
        return strlen(field) == n && strncmp(msg, field, n) == 0;
}

/* msg said with x4ctl's names for what the daemon names by field, malloc'ed; NULL when msg names
 * no field x4ctl filled from its command line (or out of memory: msg is shown as it is then).
 * schema_path: --json-schema's FILE (NULL: none sent); chat: the prompt is x4ctl chat's
 * conversation. */
static char *option_message(const char *msg, const char *schema_path, bool chat) {
        size_t n = strspn(msg, "abcdefghijklmnopqrstuvwxyz_.");
        const char *rest = msg + n;
        unsigned long index = 0;
        bool indexed = false;
        char *out = NULL;

        if (n == 0)
                return NULL;
        if (*rest == '[') { /* FIELD[N]: */
                char *end;
                errno = 0;
                index = strtoul(rest + 1, &end, 10);
                if (end == rest + 1 || *end != ']' || errno)
                        return NULL;
                indexed = true;
                rest = end + 1;
        }
        if (*rest != ':')
                return NULL;
        rest++;
        const char *option = NULL;
        for (size_t i = 0; i < ELEMENTSOF(option_fields); i++)
                if (field_is(msg, n, option_fields[i].field))
                        option = option_fields[i].option;
        if (option && indexed && streq_(option, "--tokens"))
                return asprintf(&out, "--tokens: item %lu,%s", index + 1, rest) < 0 ? NULL : out;
        if (option && indexed && streq_(option, "--stop"))
                return asprintf(&out, "--stop number %lu:%s", index + 1, rest) < 0 ? NULL : out;
        if (option)
                return asprintf(&out, "%s:%s", option, rest) < 0 ? NULL : out;
        if (indexed)
                return NULL;
        /* the prompt x4ctl built: its text, or the chat of --system and the prompt (x4ctl chat:
         * the conversation so far) */
        if (field_is(msg, n, "prompt") || field_is(msg, n, "prompt.text") || field_is(msg, n, "prompt.chat") ||
            field_is(msg, n, "prompt.chat.messages"))
                return asprintf(&out, "%s:%s", chat ? "the conversation" : "the prompt", rest) < 0 ? NULL
                                                                                                : out;
        if (schema_path && (field_is(msg, n, "constraint") || field_is(msg, n, "constraint.json_schema")))
                return asprintf(&out, "--json-schema %s:%s", schema_path, rest) < 0 ? NULL : out;
        return NULL;
}

/* How a submitted request ended (copied out of the done callback). */
struct run_end {
        bool done;
        struct x4_done d;
        char stop[256];
};

static void on_done(const struct x4_done *d, void *userdata) {
        struct run_end *end = userdata;
        end->d = *d;
        end->d.error_message = NULL;
        end->d.stop = NULL;
        if (d->stop) {
                snprintf(end->stop, sizeof end->stop, "%s", d->stop);
                end->d.stop = end->stop;
        }
        end->done = true;
}

struct run_ctx {
        struct gen_state *s;
        struct run_end end;
};

static int ctx_chunk(const struct x4_chunk *ch, void *userdata) {
        return on_chunk(ch, ((struct run_ctx *) userdata)->s);
}

static void ctx_done(const struct x4_done *d, void *userdata) {
        on_done(d, &((struct run_ctx *) userdata)->end);
}

static void ctx_progress(uint64_t request_id, uint32_t done, uint32_t total, void *userdata) {
        on_progress(request_id, done, total, ((struct run_ctx *) userdata)->s);
}

/* Run one request to its end; returns an exit code. The request is submitted and the socket
 * polled here (not x4_client_generate()), so Ctrl-C cancels it at once, also during a long
 * prefill when no chunk comes to notice the signal. */
static int run_generate(x4_client *c, x4_request *req, struct gen_state *s) {
        struct run_ctx ctx = { .s = s };
        uint64_t rid;
        bool cancel_sent = false;
        s->progress_tty = isatty(STDERR_FILENO);
        x4_client_set_progress_cb(c, ctx_progress);
        int e = x4_client_submit(c, req, ctx_chunk, ctx_done, &ctx, &rid);
        bool sent = e >= 0;
        while (e >= 0 && !ctx.end.done) {
                if (interrupted && !cancel_sent) {
                        (void) x4_client_cancel(c, rid); /* it still ends with a Done */
                        cancel_sent = true;
                }
                struct pollfd pfd = { .fd = x4_client_fd(c), .events = POLLIN };
                int r = poll(&pfd, 1, arg.response_ms);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r == 0) {
                        fprintf(stderr, "x4ctl: no reply from the daemon for %d ms (--timeout)\n", arg.response_ms);
                        (void) x4_client_cancel(c, rid);
                        return EXIT_TIMEOUT;
                }
                if (r < 0 || x4_client_dispatch(c) < 0) {
                        s->conn_lost = true;
                        break; /* a broken connection has ended the request (ctx.end) */
                }
        }
        if (e >= 0 && ctx.end.done)
                e = ctx.end.d.status;
        else if (e >= 0)
                e = X4_E_IO;
        clear_progress(s);
        const struct x4_done *d = &ctx.end.d;
        if (s->output_gone)
                return EXIT_OK; /* nobody reads the rest, nor a note about it (as `yes | head`) */
        if (!s->json && s->any_output)
                putchar('\n');
        if (e < 0) {
                s->error = e;
                /* sent: the daemon answered this request with an Error; not sent: a request over
                 * the frame limit is refused here, any other failure is the connection's */
                s->refused = sent ? !s->conn_lost : e == X4_E_TOO_LARGE;
                /* the daemon's refusal of a field x4ctl filled from an option: said as the option */
                _cleanup_free_ char *said = s->refused && sent ? option_message(x4_client_last_error(c),
                                                                              s->json_schema_path, s->chat)
                                                             : NULL;
                const char *m = said ? said : x4_client_last_error(c);
                if (s->json) {
                        printf("{\"type\":\"error\",\"code\":\"%s\",\"message\":", x4_strerror(e));
                        json_str(stdout, m, strlen(m));
                        printf("}\n");
                }
                fprintf(stderr, "x4ctl: %s\n", m);
                return exit_code_of(e);
        }
        if (s->json)
                print_done(d);
        fflush(stdout);
        if (d->finish_reason == X4_FINISH_CANCELLED) {
                s->cancelled = true;
                fprintf(stderr, "x4ctl: cancelled after %u token%s%s%s\n", d->completion_tokens,
                        d->completion_tokens == 1 ? "" : "s",
                        interrupted ? " (Ctrl-C)" : " (by x4ctl cancel, or the daemon shutting down)",
                        s->chat ? "; the conversation keeps the answer so far, marked " CHAT_CUT_MARK : "");
                /* cancelled from elsewhere: what came is the answer (exit 0), the note says why it is short */
                return interrupted ? EXIT_INTERRUPTED : EXIT_OK;
        }
        if (d->finish_reason == X4_FINISH_LENGTH && !s->any_content && d->reasoning_tokens > 0 && !s->no_think) {
                fprintf(stderr, "x4ctl: the output budget (%u token%s) ran out while the model was still thinking; "
                                "nothing was answered. Raise --max-tokens, cap the thinking with "
                                "--thinking-budget N, or turn it off with --no-think (--show-think shows it)\n",
                        d->completion_tokens, d->completion_tokens == 1 ? "" : "s");
                return EXIT_NO_ANSWER;
        }
        /* the template opened the thinking and the model ended its turn at once (its first token a
         * turn end): no reasoning token was counted, but the answer is as missing as after 100 */
        bool thought = d->reasoning_tokens > 0 || s->last_channel == X4_CHANNEL_REASONING;
        if (d->finish_reason == X4_FINISH_STOP && !s->any_content && thought && !s->no_think && !d->stop) {
                if (d->reasoning_tokens)
                        fprintf(stderr, "x4ctl: the model ended its turn while still thinking (%u token%s); ",
                                d->reasoning_tokens, d->reasoning_tokens == 1 ? "" : "s");
                else
                        fprintf(stderr, "x4ctl: the model ended its turn at once, before thinking or answering; ");
                fprintf(stderr, "nothing was answered. Ask again (another --seed), or turn the thinking off "
                                "with --no-think (--show-think shows it)\n");
                return EXIT_NO_ANSWER;
        }
        if (d->finish_reason == X4_FINISH_LENGTH && s->json_schema && s->any_content) {
                fprintf(stderr, "x4ctl: the output budget (%u token%s) ran out before the JSON answer was "
                                "complete: what was printed is not valid JSON. Raise --max-tokens\n",
                        d->completion_tokens, d->completion_tokens == 1 ? "" : "s");
                return EXIT_FAIL;
        }
        return EXIT_OK;
}

static int cmd_generate(int argc, char **argv) {
        struct gen_opts o = {};
        int r = parse_gen_opts(argc, argv, &o);
        x4_client *c = NULL;
        char *prompt = NULL;

        if (r != 0)
                goto out;
        if (o.tokens) {
                if (optind < argc) {
                        r = usage_error("generate: --tokens and a text prompt ('%s') exclude each other",
                                        argv[optind]);
                        goto out;
                }
                r = request_tokens(o.req, o.tokens);
                if (r != 0)
                        goto out;
        } else {
                /* a lone "-" first reads stdin too */
                bool dash = optind < argc && strcmp(argv[optind], "-") == 0;
                if (dash && optind + 1 < argc) {
                        r = usage_error("generate: '-' (the prompt on stdin) and a prompt on the command line "
                                        "('%s') exclude each other", argv[optind + 1]);
                        goto out;
                }
                if (o.raw && o.system) {
                        r = usage_error("%s", "generate: --system needs the chat template; --raw sends the text as is");
                        goto out;
                }
                r = read_prompt(argc, argv, dash ? argc : optind, o.raw, false, &prompt);
                if (r != 0)
                        goto out;
                request_prompt(o.req, prompt, o.raw, o.system);
                if (!o.raw && o.thinking >= 0)
                        x4_request_set_thinking(o.req, o.thinking);
        }
        r = open_client(&c);
        if (r != 0)
                goto out;
        struct gen_state s = { .show_think = o.show_think, .json = arg.json, .no_think = o.thinking == 0,
                               .json_schema = o.json_schema, .json_schema_path = o.json_schema_path };
        r = run_generate(c, o.req, &s);
        free(s.reply);
        if (r == EXIT_OK && o.logprobs && !arg.json) /* the text output has no place for them */
                fputs("x4ctl: --logprobs: the log probabilities are shown only with --json (an object a line)\n",
                      stderr);
out:
        x4_client_free(c);
        x4_request_free(o.req);
        free(prompt);
        return r;
}

/* The chat's finished turns, apart from the request (whose messages can only grow) so that a turn
 * can be left out of the conversation: texts alternate user, assistant. */
struct chat_history {
        char **text;
        size_t n;
};

static void chat_history_clear(struct chat_history *h) {
        for (size_t i = 0; i < h->n; i++)
                free(h->text[i]);
        free(h->text);
        *h = (struct chat_history) {};
}

static int chat_history_add(struct chat_history *h, const char *user, const char *assistant) {
        char **n = realloc(h->text, (h->n + 2) * sizeof *n);
        if (!n)
                return -ENOMEM;
        h->text = n;
        char *u = strdup(user), *a = strdup(assistant);
        if (!u || !a) {
                free(u);
                free(a);
                return -ENOMEM;
        }
        n[h->n++] = u;
        n[h->n++] = a;
        return 0;
}

/* The conversation's start in o->req: the --system message and the thinking switch, then the
 * history. Returns 0 or an exit code. */
static int chat_fill(struct gen_opts *o, const struct chat_history *h) {
        int e = 0;
        if (o->system)
                e = x4_request_add_message(o->req, "system", o->system);
        if (e >= 0 && o->thinking >= 0)
                e = x4_request_set_thinking(o->req, o->thinking);
        for (size_t i = 0; e >= 0 && i < h->n; i++)
                e = x4_request_add_message(o->req, i % 2 ? "assistant" : "user", h->text[i]);
        if (e < 0) {
                fprintf(stderr, "x4ctl: out of memory\n");
                return EXIT_FAIL;
        }
        return 0;
}

/* A turn left out: o->req made again from the command line's options (their values were checked
 * by the first parse) and the history, which does not hold the turn. */
static int chat_rebuild(int argc, char **argv, struct gen_opts *o, const struct chat_history *h) {
        struct gen_opts n = {};
        int r = parse_gen_opts(argc, argv, &n);
        if (r == 0)
                r = chat_fill(&n, h);
        if (r != 0) {
                x4_request_free(n.req);
                return r;
        }
        x4_request_free(o->req);
        *o = n;
        return 0;
}

/* Why a turn is left out of the conversation, and what to do (after the daemon's reason, or the
 * note that the budget ran out while thinking: error 0). status: what the chat will exit with, 0
 * on a terminal. */
static void chat_left_out_note(int error, int status) {
        if (error == X4_E_TOO_LARGE)
                fputs("x4ctl: hint: the conversation no longer fits the model's context with this question: type "
                      "/reset to start it over (the --system message stays), or ask something shorter\n", stderr);
        else if (error == X4_E_INVALID_ARGUMENT || error == X4_E_NOT_FOUND || error == X4_E_UNIMPLEMENTED)
                fputs("x4ctl: hint: a refusal of an option of this chat (--top-k, --snapshot, ...) comes again "
                      "on every turn: start the chat again without it; /reset starts the conversation over\n",
                      stderr);
        else if (error == X4_E_UNAVAILABLE || error == X4_E_RESOURCE_EXHAUSTED)
                fputs("x4ctl: hint: the daemon is busy: ask again in a while\n", stderr);
        if (status)
                fprintf(stderr, "x4ctl: the question is left out of the conversation; the chat goes on with the "
                                "next line and ends with exit status %d\n", status);
        else
                fputs("x4ctl: the question is left out of the conversation\n", stderr);
}

/* Interactive chat: one line = one user turn. The request object accumulates the conversation
 * (the sampling options parsed into it stay), so each turn resends the history; the daemon's
 * prefix store makes the repeated part cheap. Ctrl-C stops the current answer; Ctrl-D ends.
 *
 * A cancelled answer (Ctrl-C) stays in the history as far as it came, followed by CHAT_CUT_MARK,
 * so the next turn knows it was cut rather than complete ("shorter, please" still refers to it,
 * and the model does not take the fragment for its whole answer). Ctrl-C at the prompt of a
 * terminal only clears the line (an answer that ended just before the key must not end the
 * chat); with stdin not a terminal it ends the chat, exit status 130.
 *
 * A turn that got no answer, because the daemon refused it (the conversation over the context, a
 * parameter it does not take) or failed on it, or because the budget ran out while the model was
 * thinking, is left out of the conversation, question and all (an empty answer would be taken for
 * one, and a question alone leaves two user turns in a row), and the chat goes on: the next turn
 * may fit (a shorter question, or after /reset). With stdin not a terminal the chat ends with the
 * status of the first such turn, so a script learns that a line was not answered. A lost
 * connection or a timeout ends the chat as before. */
static int cmd_chat(int argc, char **argv) {
        struct gen_opts o = {};
        int r = parse_gen_opts(argc, argv, &o);
        x4_client *c = NULL;
        char *line = NULL;
        size_t cap = 0, lineno = 0;
        struct chat_history hist = {};
        int failed = EXIT_OK; /* stdin not a terminal: the status of the first turn left out */

        if (r != 0)
                goto out;
        if (optind < argc) {
                r = usage_error("chat: unexpected argument '%s' (type the prompts on stdin)",
                                argv[optind]);
                goto out;
        }
        if (o.tokens || o.raw) {
                r = usage_error("chat: %s is for generate: chat sends each line as a user turn through the "
                                "chat template", o.tokens ? "--tokens" : "--raw");
                goto out;
        }
        r = open_client(&c);
        if (r != 0)
                goto out;
        r = chat_fill(&o, &hist);
        if (r != 0)
                goto out;
        bool tty = isatty(STDIN_FILENO);
        for (;;) {
                if (interrupted) { /* Ctrl-C at the prompt */
                        interrupted = 0;
                        if (!tty) {
                                r = EXIT_INTERRUPTED;
                                goto out;
                        }
                        fputs("\nx4ctl: Ctrl-D ends the chat; Ctrl-C only stops an answer\n", stderr);
                }
                if (tty) {
                        fputs("> ", stdout);
                        fflush(stdout);
                }
                ssize_t len = getline(&line, &cap, stdin);
                if (len < 0 && interrupted) { /* EINTR, or an end of input with the signal */
                        clearerr(stdin);
                        continue;
                }
                if (len < 0)
                        break;
                lineno++;
                while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
                        line[--len] = 0;
                if (len == 0)
                        continue;
                if (streq_(line, "/reset")) {
                        chat_history_clear(&hist);
                        r = chat_rebuild(argc, argv, &o, &hist);
                        if (r != 0)
                                goto out;
                        fputs("x4ctl: the conversation starts over (the --system message stays)\n", stderr);
                        continue;
                }
                /* a line that is no text is not sent: on a terminal the chat goes on (type it
                 * again), else it ends as any input x4ctl cannot use */
                char what[64];
                snprintf(what, sizeof what, tty ? "that line (not sent)" : "line %zu of stdin", lineno);
                if (strlen(line) != (size_t) len)
                        r = usage_error("%s holds a NUL byte (at byte %zu): text expected", what, strlen(line));
                else
                        r = check_utf8(what, line, (size_t) len);
                if (r != 0 && !tty)
                        goto out;
                if (r != 0)
                        continue;
                if (x4_request_add_message(o.req, "user", line) < 0) {
                        fprintf(stderr, "x4ctl: out of memory\n");
                        r = EXIT_FAIL;
                        goto out;
                }
                interrupted = 0;
                struct gen_state s = { .show_think = o.show_think, .json = arg.json, .no_think = o.thinking == 0,
                                       .chat = true };
                r = run_generate(c, o.req, &s);
                interrupted = 0; /* a Ctrl-C until now was for this answer */
                if (s.refused || r == EXIT_NO_ANSWER) {
                        free(s.reply);
                        if (!tty && failed == EXIT_OK)
                                failed = r;
                        chat_left_out_note(s.error, tty ? 0 : failed);
                        r = chat_rebuild(argc, argv, &o, &hist);
                        if (r != 0)
                                goto out;
                        continue;
                }
                if (s.cancelled) {
                        char *marked = NULL;
                        if (asprintf(&marked, "%s%s" CHAT_CUT_MARK, s.reply ? s.reply : "",
                                     s.reply_len ? "\n" : "") < 0)
                                marked = NULL;
                        free(s.reply);
                        s.reply = marked;
                }
                if (x4_request_add_message(o.req, "assistant", s.reply ? s.reply : "") < 0 ||
                    chat_history_add(&hist, line, s.reply ? s.reply : "") < 0) {
                        fprintf(stderr, "x4ctl: out of memory\n");
                        free(s.reply);
                        r = EXIT_FAIL;
                        goto out;
                }
                free(s.reply);
                if (s.output_gone)
                        break;
                if (r != EXIT_OK && r != EXIT_INTERRUPTED)
                        goto out;
        }
        r = failed;
out:
        free(line);
        chat_history_clear(&hist);
        x4_client_free(c);
        x4_request_free(o.req);
        return r;
}

/* ---- stats / info / health / cancel / snapshot ---------------------------------------------- */

/* The requests that ended with Done: the rest of requests_total (x4client.h says how they add
 * up; 0 from a server older than 1.6, which counted only admitted requests in the total). */
static uint64_t requests_completed(const struct x4_stats *s) {
        uint64_t other = s->requests_failed + s->requests_cancelled + s->requests_refused +
                         s->requests_in_flight;
        return s->requests_total > other ? s->requests_total - other : 0;
}

static void print_stats_json(const struct x4_stats *s, const struct x4_request_state *q, size_t n) {
        printf("{\"uptime_ms\":%" PRIu64 ",\"connections\":%u,\"requests_running\":%u,"
               "\"requests_waiting\":%u,\"requests_total\":%" PRIu64 ",\"requests_completed\":%" PRIu64
               ",\"requests_failed\":%" PRIu64 ",\"requests_cancelled\":%" PRIu64
               ",\"requests_refused\":%" PRIu64 ",\"requests_queue_full\":%u"
               ",\"requests_in_flight\":%u,\"prompt_tokens_total\":%" PRIu64
               ",\"completion_tokens_total\":%" PRIu64 ",\"prefill_tok_s\":%.3f,\"decode_tok_s\":%.3f,"
               "\"cache_pages_total\":%u,\"cache_pages_used\":%u,\"cache_page_tokens\":%u,"
               "\"memory_used\":%" PRIu64 ",\"memory_total\":%" PRIu64 ",\"prefix_hits\":%" PRIu64
               ",\"prefix_tokens_reused\":%" PRIu64 ",\"prefix_misses\":%" PRIu64
               ",\"prefix_pages\":%u,\"engine_steps\":%" PRIu64 ",\"engine_steps_batched\":%" PRIu64
               ",\"batch_max\":%u,\"mtp_drafted_tokens\":%" PRIu64 ",\"mtp_accepted_tokens\":%" PRIu64
               ",\"requests\":[",
               s->uptime_ms, s->connections, s->requests_running, s->requests_waiting,
               s->requests_total, requests_completed(s), s->requests_failed, s->requests_cancelled,
               s->requests_refused, s->requests_queue_full, s->requests_in_flight,
               s->prompt_tokens_total, s->completion_tokens_total, s->prefill_tok_s,
               s->decode_tok_s, s->cache_pages_total, s->cache_pages_used, s->cache_page_tokens,
               s->memory_used, s->memory_total, s->prefix_hits, s->prefix_tokens_reused,
               s->prefix_misses, s->prefix_pages, s->engine_steps, s->engine_steps_batched,
               s->batch_max, s->mtp_drafted_tokens, s->mtp_accepted_tokens);
        for (size_t i = 0; i < n; i++) {
                printf("%s{\"server_request_id\":%" PRIu64 ",\"running\":%s,\"prompt_tokens\":%u,"
                       "\"prefilled_tokens\":%u,\"completion_tokens\":%u,\"age_ms\":%" PRIu64
                       ",\"peer_pid\":%u,\"peer_uid\":%u,\"paused\":%s,\"client\":",
                       i ? "," : "", q[i].server_request_id, q[i].running ? "true" : "false",
                       q[i].prompt_tokens, q[i].prefilled_tokens, q[i].completion_tokens,
                       q[i].age_ms, q[i].peer_pid, q[i].peer_uid, q[i].paused ? "true" : "false");
                json_str(stdout, q[i].client, strlen(q[i].client));
                printf("}");
        }
        printf("]}\n");
}

static void print_stats_table(const struct x4_stats *s, const struct x4_request_state *q,
                              size_t n) {
        double mib = 1024.0 * 1024.0;
        printf("uptime          %.1f s\n", s->uptime_ms / 1000.0);
        printf("connections     %u\n", s->connections);
        printf("requests        %u running, %u waiting\n", s->requests_running, s->requests_waiting);
        /* total = completed + failed + cancelled + refused + in flight (x4ctl(1) says what each
         * counts) */
        printf("received        %" PRIu64 ": %" PRIu64 " completed, %" PRIu64 " failed, %" PRIu64
               " cancelled, %" PRIu64 " refused (%u queue full), %u in flight\n",
               s->requests_total, requests_completed(s), s->requests_failed, s->requests_cancelled,
               s->requests_refused, s->requests_queue_full, s->requests_in_flight);
        printf("tokens          %" PRIu64 " prompt, %" PRIu64 " completion\n",
               s->prompt_tokens_total, s->completion_tokens_total);
        printf("rates           %.1f tok/s prefill, %.1f tok/s decode\n", s->prefill_tok_s,
               s->decode_tok_s);
        printf("cache pages     %u / %u used (%u tokens each)\n", s->cache_pages_used,
               s->cache_pages_total, s->cache_page_tokens);
        printf("memory          %.1f / %.1f MiB\n", s->memory_used / mib, s->memory_total / mib);
        printf("prefix cache    %" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64
               " tokens reused, %u pages kept\n",
               s->prefix_hits, s->prefix_misses, s->prefix_tokens_reused, s->prefix_pages);
        printf("batching        %" PRIu64 " steps, %" PRIu64 " with more than one request, "
               "at most %u\n", s->engine_steps, s->engine_steps_batched, s->batch_max);
        if (s->mtp_drafted_tokens)
                printf("mtp             %" PRIu64 " drafted, %" PRIu64 " accepted (%.1f%%)\n",
                       s->mtp_drafted_tokens, s->mtp_accepted_tokens,
                       100.0 * (double) s->mtp_accepted_tokens / (double) s->mtp_drafted_tokens);
        if (n) {
                printf("\n%8s %-8s %8s %9s %8s %9s %8s  %s\n", "ID", "STATE", "PROMPT", "PREFILLED",
                       "OUTPUT", "AGE", "PID", "CLIENT");
                for (size_t i = 0; i < n; i++)
                        printf("%8" PRIu64 " %-8s %8u %9u %8u %8.1fs %8u  %s\n",
                               q[i].server_request_id,
                               q[i].paused ? "paused" : q[i].running ? "running" : "waiting",
                               q[i].prompt_tokens, q[i].prefilled_tokens, q[i].completion_tokens,
                               q[i].age_ms / 1000.0, q[i].peer_pid, q[i].client);
        }
}

static int cmd_stats(int argc, char **argv) {
        static const struct option opts[] = {
                { "json", no_argument, NULL, OPT_JSON },
                { "watch", optional_argument, NULL, OPT_WATCH },
                {}
        };
        double watch = 0;
        bool watch_bare = false; /* --watch without =S */
        int c;
        x4_client *cl = NULL;

        optind = 0; /* 0: GNU getopt re-initialises (permutation, not the "+" of the global pass) */
        while ((c = getopt_long(argc, argv, "", opts, NULL)) >= 0) {
                if (c == OPT_JSON)
                        arg.json = true;
                else if (c == OPT_WATCH) {
                        float f = 1.0f;
                        /* at most a day: a longer one is a typo, and beyond time_t's reach */
                        if (optarg && (parse_float(optarg, &f) < 0 || f < 0.1f || f > 86400.0f))
                                return usage_error("--watch: '%s' is not an interval from 0.1 to 86400 s",
                                                   optarg);
                        watch = f;
                        watch_bare = !optarg;
                } else
                        return EXIT_USAGE;
        }
        float f;
        if (optind < argc && watch_bare && parse_float(argv[optind], &f) == 0)
                return usage_error("stats: unexpected argument '%s' (the interval goes with an '=': "
                                   "--watch=%s)", argv[optind], argv[optind]);
        if (optind < argc)
                return usage_error("stats: unexpected argument '%s'", argv[optind]);
        int r = open_client(&cl);
        if (r != 0)
                return r;
        do {
                struct x4_stats s;
                struct x4_request_state *q = NULL;
                size_t n = 0;
                int e = x4_client_stats(cl, &s);
                if (e >= 0)
                        e = x4_client_requests(cl, &q, &n);
                if (e < 0) {
                        r = fail_client(cl, e);
                        break;
                }
                if (arg.json)
                        print_stats_json(&s, q, n);
                else {
                        if (watch > 0 && isatty(STDOUT_FILENO))
                                fputs("\033[H\033[2J", stdout);
                        print_stats_table(&s, q, n);
                }
                free(q);
                if (fflush(stdout) == EOF || ferror(stdout))
                        break; /* stats --watch | head: the reader is gone (SIGPIPE is ignored) */
                if (watch > 0) {
                        struct timespec ts = { (time_t) watch,
                                               (long) ((watch - (time_t) watch) * 1e9) };
                        while (nanosleep(&ts, &ts) < 0 && errno == EINTR && !interrupted)
                                ;
                        if (!arg.json)
                                putchar('\n');
                }
        } while (watch > 0 && !interrupted);
        x4_client_free(cl);
        return r;
}

/* The arguments of a command that takes only --json (info, health): 0, or the usage error's exit
 * status naming the first other one. */
static int json_only_args(const char *cmd, int argc, char **argv) {
        for (int i = 1; i < argc; i++) {
                if (!streq_(argv[i], "--json"))
                        return usage_error("%s: unexpected argument '%s' (only --json is taken)", cmd, argv[i]);
                arg.json = true;
        }
        return 0;
}

static int cmd_info(int argc, char **argv) {
        x4_client *c;
        struct x4_info i;
        int r = json_only_args("info", argc, argv);
        if (r != 0)
                return r;
        r = open_client(&c);
        if (r != 0)
                return r;
        int e = x4_client_info(c, &i);
        if (e < 0) {
                r = fail_client(c, e);
                x4_client_free(c);
                return r;
        }
        if (arg.json) {
                printf("{\"server_version\":");
                json_str(stdout, i.server_version, strlen(i.server_version));
                printf(",\"backend\":");
                json_str(stdout, i.backend, strlen(i.backend));
                printf(",\"model\":{\"architecture\":");
                json_str(stdout, i.model_architecture, strlen(i.model_architecture));
                printf(",\"name\":");
                json_str(stdout, i.model_name, strlen(i.model_name));
                printf(",\"fingerprint\":");
                json_str(stdout, i.model_fingerprint, strlen(i.model_fingerprint));
                printf(",\"path\":");
                json_str(stdout, i.model_path, strlen(i.model_path));
                printf(",\"config_source\":");
                json_str(stdout, i.config_source, strlen(i.config_source));
                printf(",\"n_vocab\":%u,\"n_ctx\":%u,\"n_layer\":%u,\"n_embd\":%u,\"n_expert\":%u,"
                       "\"n_expert_used\":%u,\"bos_id\":%d,\"eos_id\":%d,\"has_tokenizer\":%s},"
                       "\"max_frame\":%u,\"max_tokens_default\":%u,\"max_running\":%u,"
                       "\"cache_pages_total\":%u,\"cache_page_tokens\":%u}\n",
                       i.n_vocab, i.n_ctx, i.n_layer, i.n_embd, i.n_expert, i.n_expert_used,
                       i.bos_id, i.eos_id, i.has_tokenizer ? "true" : "false", i.max_frame,
                       i.max_tokens_default, i.max_running, i.cache_pages_total,
                       i.cache_page_tokens);
        } else {
                printf("server          %s\n", i.server_version);
                printf("backend         %s\n", i.backend);
                printf("model           %s (%s)\n", i.model_name, i.model_architecture);
                printf("path            %s\n", i.model_path);
                printf("config          %s\n", i.config_source);
                printf("fingerprint     %s\n", i.model_fingerprint);
                printf("shape           %u layers, embd %u, vocab %u, %u/%u experts\n", i.n_layer,
                       i.n_embd, i.n_vocab, i.n_expert_used, i.n_expert);
                printf("context         %u tokens\n", i.n_ctx);
                printf("tokenizer       %s\n", i.has_tokenizer ? "yes" : "no (token ids only)");
                printf("limits          %u running, %u max tokens default, %u bytes per frame\n",
                       i.max_running, i.max_tokens_default, i.max_frame);
                printf("cache           %u pages of %u tokens\n", i.cache_pages_total,
                       i.cache_page_tokens);
        }
        x4_client_free(c);
        return EXIT_OK;
}

static int cmd_health(int argc, char **argv) {
        x4_client *c;
        int status;
        char detail[256];
        /* --json after the command too, as info and stats take it */
        int r = json_only_args("health", argc, argv);
        if (r != 0)
                return r;
        r = open_client(&c);
        if (r != 0)
                return r;
        int e = x4_client_health(c, &status, detail, sizeof detail);
        if (e < 0) {
                r = fail_client(c, e);
                x4_client_free(c);
                return r;
        }
        static const char *names[] = { "unknown", "serving", "loading", "draining" };
        const char *name = status >= 0 && status < 4 ? names[status] : "unknown";
        if (arg.json) {
                printf("{\"status\":\"%s\",\"detail\":", name);
                json_str(stdout, detail, strlen(detail));
                printf("}\n");
        } else
                printf("%s%s%s\n", name, *detail ? ": " : "", detail);
        x4_client_free(c);
        return status == X4_HEALTH_SERVING ? EXIT_OK : EXIT_UNAVAILABLE;
}

static int cmd_cancel(int argc, char **argv) {
        x4_client *c;
        uint64_t id;
        if (argc != 2)
                return usage_error("cancel: expects one server request id, as x4ctl stats shows%s", "");
        if (parse_u64(argv[1], &id) < 0)
                return usage_error("cancel: '%s' is not a request id", argv[1]);
        int r = open_client(&c);
        if (r != 0)
                return r;
        int e = x4_client_cancel_server(c, id);
        const char *m = e < 0 ? x4_client_last_error(c) : "";
        const char *field = "Cancel.server_request_id: "; /* the protocol's name for ID */
        if (e < 0 && strncmp(m, field, strlen(field)) == 0) {
                fprintf(stderr, "x4ctl: cancel: %s\n", m + strlen(field));
                r = exit_code_of(e);
        } else if (e < 0)
                r = fail_client(c, e);
        x4_client_free(c);
        return r;
}

static int cmd_snapshot(int argc, char **argv) {
        static const struct option opts[] = {
                { "tokens", required_argument, NULL, OPT_TOKENS },
                { "raw", no_argument, NULL, OPT_RAW },
                { "system", required_argument, NULL, OPT_SYSTEM },
                { "replace", no_argument, NULL, OPT_REPLACE },
                { "json", no_argument, NULL, OPT_JSON },
                {}
        };
        const char *tokens = NULL, *system = NULL;
        bool raw = false, replace = false;
        x4_client *c = NULL;
        int r, e, o;

        if (argc < 2)
                return usage_error("snapshot: expects create, list or drop%s", "");
        const char *op = argv[1];
        argc--;
        argv++;
        static char op_name[80];
        snprintf(op_name, sizeof op_name, "x4ctl snapshot %s", op);
        argv[0] = op_name; /* for getopt's messages */
        optind = 0; /* 0: GNU getopt re-initialises (permutation, not the "+" of the global pass) */
        while ((o = getopt_long(argc, argv, "", opts, NULL)) >= 0) {
                if (o == OPT_TOKENS)
                        tokens = optarg;
                else if (o == OPT_RAW)
                        raw = true;
                else if (o == OPT_SYSTEM)
                        system = optarg;
                else if (o == OPT_REPLACE)
                        replace = true;
                else if (o == OPT_JSON)
                        arg.json = true;
                else
                        return EXIT_USAGE;
        }
        if (streq_(op, "list")) {
                struct x4_snapshot_info *a;
                size_t n;
                if (optind < argc)
                        return usage_error("snapshot list: unexpected argument '%s'", argv[optind]);
                r = open_client(&c);
                if (r != 0)
                        return r;
                e = x4_client_snapshot_list(c, &a, &n);
                if (e < 0) {
                        r = fail_client(c, e);
                        x4_client_free(c);
                        return r;
                }
                if (arg.json) {
                        printf("[");
                        for (size_t i = 0; i < n; i++) {
                                printf("%s{\"name\":", i ? "," : "");
                                json_str(stdout, a[i].name, strlen(a[i].name));
                                printf(",\"n_tokens\":%u,\"bytes\":%" PRIu64 ",\"created_unix\":%" PRIu64 "}",
                                       a[i].n_tokens, a[i].bytes, a[i].created_unix);
                        }
                        printf("]\n");
                } else if (!n) {
                        printf("no snapshots (x4ctl snapshot create NAME PROMPT... makes one)\n");
                } else {
                        printf("%-32s %10s %12s\n", "NAME", "TOKENS", "BYTES");
                        for (size_t i = 0; i < n; i++)
                                printf("%-32s %10u %12" PRIu64 "\n", a[i].name, a[i].n_tokens,
                                       a[i].bytes);
                }
                free(a);
                x4_client_free(c);
                return EXIT_OK;
        }
        if (streq_(op, "drop")) {
                if (argc - optind != 1)
                        return usage_error("snapshot drop: expects one NAME%s", "");
                r = open_client(&c);
                if (r != 0)
                        return r;
                e = x4_client_snapshot_drop(c, argv[optind]);
                r = e < 0 ? fail_client(c, e) : EXIT_OK;
                x4_client_free(c);
                return r;
        }
        if (streq_(op, "create")) {
                if (argc - optind < 1)
                        return usage_error("snapshot create: expects NAME [PROMPT...]%s", "");
                const char *name = argv[optind++];
                x4_request *src = x4_request_new();
                char *prompt = NULL;
                if (!src)
                        return EXIT_FAIL;
                if (tokens && optind < argc)
                        r = usage_error("snapshot create: --tokens and a text prompt ('%s') exclude each other",
                                        argv[optind]);
                else if (raw && system)
                        r = usage_error("%s", "snapshot create: --system needs the chat template; --raw sends "
                                        "the text as is");
                else if (tokens)
                        r = request_tokens(src, tokens);
                else if (system && optind >= argc && isatty(STDIN_FILENO)) {
                        request_prompt(src, NULL, false, system); /* a system prompt cached once */
                        r = 0;
                } else {
                        /* with --system the user message is optional: a system-only conversation */
                        r = read_prompt(argc, argv, optind, raw, system != NULL, &prompt);
                        if (r == 0)
                                request_prompt(src, prompt, raw, system);
                }
                if (r != 0) {
                        x4_request_free(src);
                        return r;
                }
                r = open_client(&c);
                if (r == 0) {
                        struct x4_snapshot_info info;
                        e = x4_client_snapshot_create_flags(c, name, src, 0,
                                                            replace ? X4_SNAPSHOT_REPLACE : 0, &info);
                        _cleanup_free_ char *said = NULL;
                        if (e < 0 && (said = option_message(x4_client_last_error(c), NULL, false))) {
                                fprintf(stderr, "x4ctl: %s\n", said); /* the prompt, not prompt.text */
                                r = exit_code_of(e);
                        } else if (e < 0)
                                r = fail_client(c, e);
                        else if (arg.json)
                                printf("{\"name\":\"%s\",\"n_tokens\":%u,\"bytes\":%" PRIu64 "}\n",
                                       info.name, info.n_tokens, info.bytes);
                        else
                                printf("%s: %u tokens, %" PRIu64 " bytes\n", info.name,
                                       info.n_tokens, info.bytes);
                }
                x4_client_free(c);
                x4_request_free(src);
                free(prompt);
                return r;
        }
        return usage_error("snapshot: unknown operation '%s' (create, list, drop)", op);
}

/* `x4ctl COMMAND --help`: that command's usage on stdout, exit 0. */
static const char *const gen_help =
        "  --system TEXT         system message (chat template)\n"
        "  --no-think            no reasoning before the answer\n"
        "  --show-think          the reasoning to stderr as it comes\n"
        "  --max-tokens N        output budget, reasoning included\n"
        "  --thinking-budget N   most reasoning tokens before the answer starts (-1: no limit)\n"
        "  --json-schema FILE    the answer is JSON valid against the JSON Schema in FILE\n"
        "  --temperature T  --top-p P  --top-k K  --min-p P  --seed N\n"
        "  --repetition-penalty R  --presence-penalty P  --frequency-penalty F\n"
        "  --stop STR  --stop-id ID  --snapshot NAME  --logprobs N  --ignore-eos\n"
        "  --no-mtp              no speculative decoding for this request\n"
        "  --json                one JSON object per line (chunks, then done or error)\n";

static bool cmd_help(const char *cmd, int argc, char **argv) {
        bool want = false;
        for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
                want = want || streq_(argv[i], "--help") || streq_(argv[i], "-h");
        if (!want)
                return false;
        if (streq_(cmd, "generate") || streq_(cmd, "gen"))
                printf("Usage: x4ctl generate [OPTIONS] [PROMPT...]\n"
                       "Generate an answer to PROMPT (stdin if none or '-'), streamed to stdout.\n\n"
                       "  --tokens IDS          a token-id prompt (1,2,3) instead of text\n"
                       "  --raw                 the prompt as raw text, no chat template\n%s\n"
                       "Exit status: 0 ok (also when cancelled from elsewhere: a note says so), 1 failed, 7 the budget\n"
                       "ran out while thinking (nothing answered), 130 interrupted (Ctrl-C cancels the request);\n"
                       "see x4ctl --help for the rest.\n",
                       gen_help);
        else if (streq_(cmd, "chat"))
                printf("Usage: x4ctl chat [OPTIONS]\n"
                       "Interactive chat: each line on stdin is a user turn; the history is resent each turn.\n"
                       "Ctrl-C stops the current answer, Ctrl-D ends. A stopped answer stays in the history as\n"
                       "far as it came, followed by " CHAT_CUT_MARK ", so the next turn knows it\n"
                       "was cut. Ctrl-C at the prompt clears the line (stdin not a terminal: ends, exit 130).\n"
                       "The line /reset starts the conversation over (the --system message stays).\n"
                       "A turn the daemon refuses (the conversation over the context, ...) or that gets no\n"
                       "answer (the budget spent thinking) is left out of the conversation and the chat goes\n"
                       "on; with stdin not a terminal it then ends with the status of the first such turn.\n"
                       "A lost connection ends the chat.\n\n%s",
                       gen_help);
        else if (streq_(cmd, "stats"))
                printf("Usage: x4ctl stats [--json] [--watch[=SECONDS]]\n"
                       "The daemon's counters, cache use and the requests waiting or running.\n"
                       "  --watch[=S]   repeat every S seconds (default 1) until Ctrl-C, which ends it\n"
                       "                with exit status 0 (no request is cut short; 130 is for a cancelled generate)\n");
        else if (streq_(cmd, "cancel"))
                printf("Usage: x4ctl cancel ID\n"
                       "Cancel a request by its server id (the id column of x4ctl stats), whoever sent it.\n");
        else if (streq_(cmd, "snapshot"))
                printf("Usage: x4ctl snapshot create NAME [--replace] [--tokens IDS | --raw | --system TEXT] [PROMPT...]\n"
                       "       x4ctl snapshot list\n"
                       "       x4ctl snapshot drop NAME\n"
                       "Keep the cache state after a prompt under NAME; generate --snapshot NAME resumes it.\n"
                       "Without --tokens or --raw it is a chat snapshot: the start of a conversation (the\n"
                       "--system message, the PROMPT as the user's, no generation prompt; --system alone is\n"
                       "a system prompt cached once). A chat request on it continues that conversation: its\n"
                       "own --system may be left out or be the same. A --tokens or --raw snapshot's tokens\n"
                       "come before any request's whole prompt.\n"
                       "An existing NAME is refused (exit 8) unless --replace is given.\n");
        else if (streq_(cmd, "info"))
                printf("Usage: x4ctl info [--json]\nThe model, the backend and the daemon's limits.\n");
        else if (streq_(cmd, "health"))
                printf("Usage: x4ctl health [--json]\nThe daemon's state; exit 0 only while it serves.\n");
        else
                return false;
        return true;
}

static void help(void) {
        printf("x4ctl [OPTIONS] COMMAND [ARGS]  -- talk to the xing4d inference daemon\n\n"
               "Commands:\n"
               "  generate [OPTS] [PROMPT...]   generate, streaming to stdout (prompt from stdin if none or '-')\n"
               "  chat [OPTS]                   interactive chat (one line per turn; Ctrl-C stops an answer)\n"
               "  stats [--json] [--watch[=S]]  server counters and the requests in flight\n"
               "  cancel ID                     cancel a request by its server id (from stats)\n"
               "  snapshot create NAME [--replace] [--tokens IDS|--raw|--system TEXT] [PROMPT...]\n"
               "  snapshot list | snapshot drop NAME\n"
               "  info [--json]                 model, backend and limits\n"
               "  health [--json]               serving / draining (exit 0 only when serving)\n\n"
               "Global options:\n"
               "  --socket PATH                 daemon socket (default $X4_SOCKET, else " X4_DEFAULT_SOCKET ")\n"
               "  --connect-timeout MS          connect + handshake limit (default 30000; -1 = none)\n"
               "  --timeout MS                  longest wait for the next reply frame (default 300000;\n"
               "                                0 or -1 = none)\n"
               "  --json                        machine-readable output (generate: one JSON object per line)\n\n"
               "Generate/chat options:\n"
               "  --system TEXT  --no-think  --show-think (reasoning to stderr)  --raw (no chat template)\n"
               "  --tokens IDS (token-id prompt, e.g. 1,2,3)  --max-tokens N  --temperature T  --top-p P\n"
               "  --top-k K  --min-p P  --seed N  --repetition-penalty R  --presence-penalty P\n"
               "  --frequency-penalty F  --stop STR  --stop-id ID  --snapshot NAME  --logprobs N\n"
               "  --thinking-budget N  --ignore-eos  --no-mtp (no speculative decoding for this request)\n"
               "  --json-schema FILE (answer valid against a JSON Schema)\n\n"
               "x4ctl COMMAND --help shows one command's usage.\n\n"
               "Exit status: 0 ok, 1 request failed, 2 usage, 3 cannot connect (or not xing4d's socket), 4 timeout,\n"
               "             5 not found, 6 daemon unavailable (draining/full), 7 nothing answered (the\n"
               "             budget ran out, or the turn ended, while thinking), 8 snapshot name taken,\n"
               "             130 interrupted\n");
}

int main(int argc, char **argv) {
        static const struct option opts[] = {
                { "socket", required_argument, NULL, OPT_SOCKET },
                { "connect-timeout", required_argument, NULL, OPT_CONNECT_TIMEOUT },
                { "timeout", required_argument, NULL, OPT_TIMEOUT },
                { "json", no_argument, NULL, OPT_JSON },
                { "help", no_argument, NULL, 'h' },
                { "version", no_argument, NULL, 'V' },
                {}
        };
        int c;
        int32_t ms;

        signal(SIGPIPE, SIG_IGN);
        struct sigaction sa = { .sa_handler = on_sigint };
        sigaction(SIGINT, &sa, NULL);

        if (argc > 0)
                argv[0] = (char *) "x4ctl"; /* getopt's messages: "x4ctl: unrecognized option" */
        /* global options stop at the command name */
        while ((c = getopt_long(argc, argv, "+hV", opts, NULL)) >= 0) {
                switch (c) {
                case OPT_SOCKET:
                        if (!*optarg)
                                return usage_error("%s", "--socket: an empty path; the daemon's socket path expected");
                        arg.socket = optarg;
                        break;
                case OPT_CONNECT_TIMEOUT:
                        if (parse_i32(optarg, &ms) < 0 || ms < -1)
                                return usage_error("--connect-timeout: '%s' is not milliseconds from 0 to "
                                                   "2147483647, or -1 for no limit", optarg);
                        arg.connect_ms = ms;
                        break;
                case OPT_TIMEOUT:
                        if (parse_i32(optarg, &ms) < 0 || ms < -1)
                                return usage_error("--timeout: '%s' is not milliseconds from 0 to 2147483647 "
                                                   "(0 or -1: no limit)", optarg);
                        arg.response_ms = ms == 0 ? -1 : ms; /* 0: no limit, as the daemon's timeouts */
                        break;
                case OPT_JSON:
                        arg.json = true;
                        break;
                case 'h':
                        help();
                        return EXIT_OK;
                case 'V':
                        printf("x4ctl " X4CTL_VERSION "\n");
                        return EXIT_OK;
                default:
                        return EXIT_USAGE;
                }
        }
        if (optind >= argc)
                return usage_error("no command given%s", "");
        const char *cmd = argv[optind];
        argc -= optind;
        argv += optind;
        /* getopt names argv[0] in its messages: "x4ctl generate: unrecognized option '--bogus'",
         * not "generate: ..." (the commands themselves go by cmd) */
        static char cmd_name[80];
        snprintf(cmd_name, sizeof cmd_name, "x4ctl %s", cmd);
        argv[0] = cmd_name;
        if (cmd_help(cmd, argc, argv))
                return EXIT_OK;
        if (streq_(cmd, "generate") || streq_(cmd, "gen"))
                return cmd_generate(argc, argv);
        if (streq_(cmd, "chat"))
                return cmd_chat(argc, argv);
        if (streq_(cmd, "stats"))
                return cmd_stats(argc, argv);
        if (streq_(cmd, "cancel"))
                return cmd_cancel(argc, argv);
        if (streq_(cmd, "snapshot"))
                return cmd_snapshot(argc, argv);
        if (streq_(cmd, "info"))
                return cmd_info(argc, argv);
        if (streq_(cmd, "health"))
                return cmd_health(argc, argv);
        return usage_error("unknown command '%s'", cmd);
}
