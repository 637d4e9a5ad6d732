#include "util/progress.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/clock.h"

struct tern_progress {
    FILE *out;
    int tty;
    char label[32];
    uint64_t total, done, start_done;
    double t0, last_draw;
    int last_step;               /* non-TTY: last 5% step printed */
};

tern_progress *tern_progress_create(FILE *out, const char *label, uint64_t total) {
    tern_progress *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->out = out;
    p->tty = out && isatty(fileno(out));
    snprintf(p->label, sizeof p->label, "%s", label);
    p->total = total;
    p->t0 = tern_now_s();
    p->last_draw = -1;
    p->last_step = -1;
    return p;
}

static void fmt_eta(char *buf, size_t n, double s) {
    if (s < 0 || s > 360000) { snprintf(buf, n, "--:--"); return; }
    int t = (int)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, n, "%d:%02d", t / 60, t % 60);
}

/* Speed counts only bytes produced in this run (a resumed pack starts
 * with bytes already done). */
static void draw(tern_progress *p, double now) {
    double frac = p->total ? (double)p->done / (double)p->total : 1.0;
    double dt = now - p->t0, rate = dt > 0 ? (double)(p->done - p->start_done) / dt : 0;
    char eta[16];
    fmt_eta(eta, sizeof eta, rate > 0 ? (double)(p->total - p->done) / rate : -1);
    if (p->tty) {
        enum { W = 30 };
        char bar[W + 1];
        int fill = (int)(frac * W);
        for (int i = 0; i < W; i++) bar[i] = i < fill ? '=' : i == fill ? '>' : ' ';
        bar[W] = '\0';
        fprintf(p->out, "\r%s [%s] %3.0f%%  %.0f/%.0f MB  %.0f MB/s  ETA %s  ", p->label, bar, frac * 100,
                p->done / 1e6, p->total / 1e6, rate / 1e6, eta);
    } else {
        fprintf(p->out, "%s: %3.0f%%  %.0f/%.0f MB  %.0f MB/s  ETA %s\n", p->label, frac * 100, p->done / 1e6,
                p->total / 1e6, rate / 1e6, eta);
    }
    fflush(p->out);
}

void tern_progress_start_at(tern_progress *p, uint64_t done) {
    if (p) p->done = p->start_done = done;
}

void tern_progress_set(tern_progress *p, uint64_t done) {
    if (!p || !p->out) return;
    p->done = done > p->total ? p->total : done;
    double now = tern_now_s();
    if (p->tty) {
        if (now - p->last_draw < 0.1) return;
    } else {
        int step = p->total ? (int)(p->done * 20 / p->total) : 20;
        if (step == p->last_step || step == 20) return;   /* 100% is the finish line's */
        p->last_step = step;
    }
    p->last_draw = now;
    draw(p, now);
}

void tern_progress_add(tern_progress *p, uint64_t n) {
    if (p) tern_progress_set(p, p->done + n);
}

void tern_progress_finish(tern_progress *p) {
    if (!p || !p->out) return;
    double dt = tern_now_s() - p->t0;
    if (p->tty) fputc('\r', p->out);
    fprintf(p->out, "%s: done, %.1f MB in %.1f s (%.0f MB/s)%s\n", p->label, (p->done - p->start_done) / 1e6, dt,
            dt > 0 ? (p->done - p->start_done) / 1e6 / dt : 0.0, p->tty ? "                              " : "");
    fflush(p->out);
}

void tern_progress_destroy(tern_progress *p) { free(p); }
