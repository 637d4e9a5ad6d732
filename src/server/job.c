#include "server/job.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/clock.h"

void srv_event_free(srv_event *ev) {
    if (!ev) return;
    free(ev->text);
    free(ev->name);
    free(ev->arguments);
    free(ev);
}

srv_event *srv_event_text(srv_ev_kind kind, const char *text, size_t len) {
    srv_event *ev = calloc(1, sizeof *ev);
    if (!ev || !(ev->text = malloc(len + 1))) { free(ev); return NULL; }
    ev->kind = kind;
    memcpy(ev->text, text, len);
    ev->text[len] = '\0';
    ev->len = len;
    return ev;
}

srv_event *srv_event_from_output(const tern_out_event *o) {
    switch (o->kind) {
    case TERN_OUT_CONTENT: return srv_event_text(SRV_EV_CONTENT, o->text, o->len);
    case TERN_OUT_REASONING: return srv_event_text(SRV_EV_REASONING, o->text, o->len);
    case TERN_OUT_TOOL_CALL: {
        srv_event *ev = calloc(1, sizeof *ev);
        if (!ev) return NULL;
        ev->kind = SRV_EV_TOOL_CALL;
        ev->index = o->call_index;
        ev->name = strdup(o->name);
        ev->arguments = strdup(o->arguments);
        if (!ev->name || !ev->arguments) { srv_event_free(ev); return NULL; }
        return ev;
    }
    default: return NULL;
    }
}

srv_job *srv_job_create(void) {
    srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    j->refs = 1;
    j->max_tokens = -1;
    return j;
}

void srv_job_retain(srv_job *j) {
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

void srv_job_release(srv_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last) return;
    for (srv_event *e = j->head, *n; e; e = n) {
        n = e->next;
        srv_event_free(e);
    }
    for (int i = 0; i < j->n_stop; i++) free(j->stop[i]);
    free(j->prompt);
    free(j->tools_json);
    tern_grammar_destroy(j->grammar);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

int srv_job_add_stop(srv_job *j, const char *s) {
    if (j->n_stop == SRV_MAX_STOP) return -1;
    char *c = strdup(s);
    if (!c) return -1;
    j->stop[j->n_stop++] = c;
    return 0;
}

void srv_job_push(srv_job *j, srv_event *ev) {
    ev->next = NULL;
    pthread_mutex_lock(&j->mu);
    if (j->tail) j->tail->next = ev;
    else j->head = ev;
    j->tail = ev;
    if (ev->kind == SRV_EV_DONE || ev->kind == SRV_EV_ERROR) j->ended = 1;
    double t = tern_now_s();
    if (j->ended || (!j->wake_at_end && t - j->last_wake >= SRV_WAKE_S)) {
        j->last_wake = t;
        pthread_cond_signal(&j->cv);
    }
    pthread_mutex_unlock(&j->mu);
}

/* Waits (the job's lock held) until an event is there or timeout_s passed. */
static void wait_event(srv_job *j, double timeout_s) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    long ns = (long)((timeout_s - (double)(long)timeout_s) * 1e9);
    until.tv_sec += (time_t)timeout_s + (until.tv_nsec + ns) / 1000000000L;
    until.tv_nsec = (until.tv_nsec + ns) % 1000000000L;
    while (!j->head) {
        if (pthread_cond_timedwait(&j->cv, &j->mu, &until) == ETIMEDOUT) break;
    }
}

int srv_job_ended(srv_job *j) {
    pthread_mutex_lock(&j->mu);
    int ended = j->ended;
    pthread_mutex_unlock(&j->mu);
    return ended;
}

int srv_job_peek(srv_job *j, double timeout_s) {
    pthread_mutex_lock(&j->mu);
    wait_event(j, timeout_s);
    int kind = j->head ? (int)j->head->kind : -1;
    pthread_mutex_unlock(&j->mu);
    return kind;
}

srv_event *srv_job_pop(srv_job *j, double timeout_s) {
    pthread_mutex_lock(&j->mu);
    wait_event(j, timeout_s);
    srv_event *ev = j->head;
    if (ev) {
        j->head = ev->next;
        if (!j->head) j->tail = NULL;
    }
    pthread_mutex_unlock(&j->mu);
    return ev;
}
