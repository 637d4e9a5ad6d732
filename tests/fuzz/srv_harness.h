/* One server endpoint's request parsing, without HTTP or a model: the body
 * is read as http.c reads it (json_loadb, an object), then the endpoint's
 * prepare function (or count_tokens) turns it into a job and an encoder
 * with tern-tiny's tokenizer. A prepared request is then answered as the
 * scheduler would: a canned generation goes through the output parser the
 * job asks for, and the encoder writes its stream or its body. A refused
 * request must give an error envelope. Each fuzz_srv_NAME.c defines
 * SRV_ENDPOINT (one of the SRV_EP_ values) and includes this file. */
#include <jansson.h>

#include "fuzz.h"
#include "server/api.h"
#include "server/job.h"
#include "server/sbuf.h"
#include "tern.h"

#define SRV_EP_CHAT 1
#define SRV_EP_COMPLETIONS 2
#define SRV_EP_RESPONSES 3
#define SRV_EP_MESSAGES 4
#define SRV_EP_COUNT_TOKENS 5

static srv_ctx ctx;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    tern_error err;
    ctx.tok = tern_tokenizer_load(FUZZ_ROOT "/models/tern-tiny", &err);
    if (!ctx.tok) { fprintf(stderr, "fuzz: %s\n", err.msg); abort(); }
    pthread_mutex_init(&ctx.tok_mu, NULL);
    ctx.responses = srv_store_create(4);
    ctx.model_id = "tern-tiny";
    ctx.n_ctx = 4096;
    ctx.think = 1;
    ctx.max_tokens = -1;
    tern_sampler_params_default(&ctx.sampling);
    int32_t eos[2] = {tern_tokenizer_token_id(ctx.tok, "<|im_end|>"), tern_tokenizer_token_id(ctx.tok, "<|endoftext|>")};
    ctx.gvocab = tern_grammar_vocab_create(ctx.tok, tern_tokenizer_vocab_size(ctx.tok), eos, 2, &err);
    if (!ctx.gvocab) { fprintf(stderr, "fuzz: %s\n", err.msg); abort(); }
    return 0;
}

#if SRV_ENDPOINT != SRV_EP_COUNT_TOKENS
static const char GENERATED[] =
    "Let me see.\n</think>\n\nHere \xc3\xa9 it is.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
    "Paris\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

typedef struct answer {
    srv_enc *enc;
    srv_job *job;
    sbuf out;
} answer;

static void emit(answer *a, srv_event *ev) {
    if (!ev) return;
    a->enc->event(a->enc, ev, &a->out);
    srv_event_free(ev);
}

static int on_output(void *user, const tern_out_event *o, tern_error *err) {
    answer *a = user;
    if (a->job->logprobs && o->kind != TERN_OUT_MALFORMED) {
        srv_event *lp = srv_event_text(SRV_EV_LOGPROBS, "", 0);
        if (!lp) abort();
        lp->lp.id = 7;
        lp->lp.logprob = -0.5f;
        lp->lp.n_top = a->job->top_logprobs;
        lp->token = (srv_bytes){"ab", 2};
        for (int k = 0; k < lp->lp.n_top; k++) {
            lp->lp.top_ids[k] = k;
            lp->lp.top_logprobs[k] = -1.0f - (float)k;
            lp->top[k] = (srv_bytes){"\xe2\x82", 2};
        }
        emit(a, lp);
    }
    emit(a, srv_event_from_output(o));
    return 0;
}

/* The scheduler's side for a canned generation. */
static void answer_job(srv_enc *enc, srv_job *j) {
    answer a = {enc, j, {0}};
    tern_error err;
    if (enc->stream) enc->start(enc, &a.out);
    if (j->raw_text) {
        emit(&a, srv_event_text(SRV_EV_CONTENT, GENERATED, sizeof GENERATED - 1));
    } else {
        tern_output_params op = {j->start_in_reasoning, j->parse_tool_calls, j->tools_json};
        tern_output_parser *p = tern_output_parser_create(&op, on_output, &a, &err);
        FUZZ_CHECK(p, "output parser for a prepared job: %s", err.msg);
        tern_output_parser_feed(p, GENERATED, sizeof GENERATED - 1, &err);
        tern_output_parser_finish(p, &err);
        tern_output_parser_destroy(p);
    }
    srv_event *done = srv_event_text(SRV_EV_DONE, "", 0);
    if (!done) abort();
    done->finish = j->n_stop ? SRV_FINISH_STOP : SRV_FINISH_EOS;
    done->stop_index = 0;
    done->usage = (srv_usage){.prompt_tokens = j->n_prompt, .completion_tokens = 20, .reasoning_tokens = 4};
    emit(&a, done);
    if (enc->stream) {
        if (enc->heartbeat) enc->heartbeat(enc, &a.out);
    } else {
        sbuf_reset(&a.out);
        enc->body(enc, &a.out);
        json_t *body = json_loadb(a.out.data ? a.out.data : "", a.out.len, 0, NULL);
        FUZZ_CHECK(json_is_object(body), "the response body is not a JSON object");
        json_decref(body);
    }
    sbuf_free(&a.out);
}

#endif

static void check_refusal(const srv_err *e, srv_api_kind api) {
    FUZZ_NOTE("%d %s", e->status, e->msg);
    FUZZ_CHECK(e->msg[0] && e->status >= 400 && e->status < 600, "refused with status %d and message '%s'", e->status,
               e->msg);
    json_t *env = srv_error_json(api, e);
    FUZZ_CHECK(env, "no error envelope for '%s' (param '%s')", e->msg, e->param);
    json_decref(env);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *body = json_loadb((const char *)data, size, 0, NULL);
    if (!json_is_object(body)) {
        json_decref(body);
        return 0;
    }
    srv_err e = {0};
    srv_api_kind api = SRV_ENDPOINT >= SRV_EP_MESSAGES ? SRV_API_ANTHROPIC : SRV_API_OPENAI;
#if SRV_ENDPOINT == SRV_EP_COUNT_TOKENS
    json_t *out = srv_count_tokens(&ctx, body, &e);
    if (out) FUZZ_CHECK(json_integer_value(json_object_get(out, "input_tokens")) > 0, "no input tokens");
    else check_refusal(&e, api);
    json_decref(out);
#else
    srv_job *j = srv_job_create();
    if (!j) abort();
    srv_enc *enc = SRV_ENDPOINT == SRV_EP_CHAT          ? srv_chat_prepare(&ctx, body, j, &e)
                   : SRV_ENDPOINT == SRV_EP_COMPLETIONS ? srv_completions_prepare(&ctx, body, j, &e)
                   : SRV_ENDPOINT == SRV_EP_RESPONSES   ? srv_responses_prepare(&ctx, body, j, &e)
                                                        : srv_messages_prepare(&ctx, body, j, &e);
    if (enc) {
        FUZZ_CHECK(j->n_prompt > 0 && j->n_prompt < ctx.n_ctx, "prompt of %d tokens", j->n_prompt);
        for (int i = 0; i < j->n_prompt; i++)
            FUZZ_CHECK(j->prompt[i] >= 0 && j->prompt[i] < tern_tokenizer_vocab_size(ctx.tok), "prompt id %d",
                       j->prompt[i]);
        FUZZ_CHECK(j->boundary >= 0 && j->boundary <= j->n_prompt, "boundary %d of %d", j->boundary, j->n_prompt);
        answer_job(enc, j);
        enc->destroy(enc);
    } else {
        check_refusal(&e, api);
    }
    srv_job_release(j);
#endif
    json_decref(body);
    return 0;
}
