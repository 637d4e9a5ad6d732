/* The tern command end to end on the embedded tern-tiny model: chat keeps
 * its session between turns (the second turn prefills only the new turn's
 * tokens), replies end their turn, and bad input gives one line and a
 * non-zero exit. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <jansson.h>

#include "tern.h"
#include "testutil.h"
#include "text/concise.h"

static int count_tokens(const char *text) {
    tern_error err;
    tern_tokenizer *tok = tern_tokenizer_load("models/tern-tiny", &err);
    cr_assert_not_null(tok, "%s", err.msg);
    int32_t *ids = NULL;
    size_t n = 0;
    cr_assert_eq(tern_tokenizer_encode(tok, text, strlen(text), 0, &ids, &n, &err), 0, "%s", err.msg);
    free(ids);
    tern_tokenizer_free(tok);
    return (int)n;
}

Test(cli, chat_second_turn_prefills_only_the_new_turn) {
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "printf 'Tell me a fortune.\\nQuote a verse about light.\\n' | %s chat --no-think --seed 3 -n 120 -t 2 2>&1",
             tern_bin());
    int rc;
    char *out = run_sh(cmd, &rc);
    cr_assert_eq(rc, 0, "%s", out);
    int p1 = -1, g1 = -1, p2 = -1, g2 = -1;
    char r1[32] = "", r2[32] = "";
    const char *a = strstr(out, "prompt ");
    cr_assert(a, "%s", out);
    sscanf(a, "prompt %d tokens, prefill %*f tok/s | generated %d tokens, decode %*f tok/s | %31s", &p1, &g1, r1);
    const char *b = strstr(a + 1, "prompt ");
    cr_assert(b, "%s", out);
    sscanf(b, "prompt %d tokens, prefill %*f tok/s | generated %d tokens, decode %*f tok/s | %31s", &p2, &g2, r2);
    /* turn 1 is the whole rendered prompt */
    int want1 = count_tokens("<|im_start|>user\nTell me a fortune.<|im_end|>\n"
                             "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    cr_assert_eq(p1, want1, "turn 1 prefilled %d tokens, the prompt has %d\n%s", p1, want1, out);
    /* the reply closed its turn, so turn 2 is "\n" + the new user turn +
     * the generation prompt: nothing of turn 1 is prefilled again */
    cr_assert_str_eq(r1, "eos", "%s", out);
    int want2 = count_tokens("\n<|im_start|>user\nQuote a verse about light.<|im_end|>\n"
                             "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    cr_assert_eq(p2, want2, "turn 2 prefilled %d tokens, expected %d\n%s", p2, want2, out);
    cr_assert_lt(p2, p1 + g1 + want2);
    free(out);
}

/* The reasoning apart from the answer: --json's "reasoning" and "text"
 * fields; on a pipe the reasoning between <think> tags before the answer;
 * --hide-reasoning prints the answer alone. */
Test(cli, chat_shows_reasoning_apart) {
    char cmd[512];
    const char *args = "chat --seed 3 -n 80 -t 2 2>/dev/null";
    snprintf(cmd, sizeof cmd, "printf 'Tell me a fortune.\\n' | %s %s --json", tern_bin(), args);
    int rc;
    char *out = run_sh(cmd, &rc);
    cr_assert_eq(rc, 0, "%s", out);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    cr_assert_not_null(j, "%s: %s", je.text, out);
    const char *text = json_string_value(json_object_get(j, "text"));
    const char *reasoning = json_string_value(json_object_get(j, "reasoning"));
    cr_assert(text && reasoning, "%s", out);
    cr_assert(*text && *reasoning, "the reply has no reasoning or no answer: %s", out);
    cr_assert(!strstr(text, "think>") && !strstr(reasoning, "think>"), "%s", out);

    snprintf(cmd, sizeof cmd, "printf 'Tell me a fortune.\\n' | %s %s", tern_bin(), args);
    char *plain = run_sh(cmd, &rc);
    cr_assert_eq(rc, 0, "%s", plain);
    char *want = NULL;
    cr_assert(asprintf(&want, "\n<think>\n%s\n</think>\n\n%s", reasoning, text) > 0);
    cr_assert(!strncmp(plain, want, strlen(want)), "printed:\n%s\nexpected it to start:\n%s", plain, want);

    snprintf(cmd, sizeof cmd, "printf 'Tell me a fortune.\\n' | %s %s --hide-reasoning", tern_bin(), args);
    char *hidden = run_sh(cmd, &rc);
    cr_assert_eq(rc, 0, "%s", hidden);
    cr_assert(strstr(hidden, text) && !strstr(hidden, reasoning) && !strstr(hidden, "think>"), "%s", hidden);
    free(want);
    free(hidden);
    free(plain);
    json_decref(j);
    free(out);
}

Test(cli, run_generates_english) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s run -p 'And God said,' -n 40 --seed 1 -t 2 2>/dev/null", tern_bin());
    int rc;
    char *out = run_sh(cmd, &rc);
    cr_assert_eq(rc, 0, "%s", out);
    /* a trained model writes words: mostly letters and spaces, common words */
    int letters = 0;
    for (const char *p = out; *p; p++) letters += (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == ' ';
    cr_assert_gt(letters, (int)strlen(out) * 3 / 4, "%s", out);
    cr_assert(strstr(out, " the ") || strstr(out, " and "), "%s", out);
    free(out);
}

static void expect_fail(const char *args, int want_rc, const char *fragment) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1 </dev/null", tern_bin(), args);
    int rc;
    char *out = run_sh(cmd, &rc);
    cr_assert_eq(rc, want_rc, "'%s' exited %d: %s", args, rc, out);
    cr_assert(strstr(out, fragment), "'%s' said: %s", args, out);
    free(out);
}

Test(cli, bad_input_is_one_line_and_nonzero) {
    expect_fail("run --bogus", 2, "unknown option '--bogus'");
    expect_fail("run -p hi -n x", 2, "-n needs an integer");
    expect_fail("run -m /nonexistent -p hi", 1, "/nonexistent/config.json");
    expect_fail("run -p hi --kv-bits 5", 2, "--kv-bits");
    expect_fail("run -p hi --expert-budget 10Q", 2, "unknown unit");
    expect_fail("frobnicate", 2, "unknown command 'frobnicate'");
    expect_fail("run --tokens '1 x 3'", 2, "'x' is not a token id");
    expect_fail("run --tokens '99999999'", 1, "out of range");
    expect_fail("tokenize", 2, "give TEXT or --decode IDS");
}

/* YaRN from the command line: tern info shows the scaling and the context
 * it gives, tern run generates with it. */
Test(cli, rope_scaling_yarn) {
    char cmd[512];
    int rc;
    snprintf(cmd, sizeof cmd, "%s info --rope-scaling yarn --ctx 1048576 2>&1", tern_bin());
    char *out = run_sh(cmd, &rc);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "rope scaling: yarn, factor 4 over 262144 native positions, beta_fast 32, beta_slow 1, "
                          "attention factor 1.13863; context 1048576 positions"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s info 2>&1", tern_bin());
    out = run_sh(cmd, &rc);
    cr_expect(strstr(out, "rope scaling: none; context 262144 positions"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s run -p 'And God said,' -n 8 --seed 1 -t 2 --rope-scaling yarn --ctx 1048576 2>&1",
             tern_bin());
    out = run_sh(cmd, &rc);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "generated 8 tokens"), "%s", out);
    free(out);
}

/* tern run --json-schema / --grammar-file: the output follows them, within
 * -n (the grammar steers the answer to end in time); what they cannot
 * enforce is one line and exit 2. */
Test(cli, run_follows_a_schema_or_a_grammar) {
    char *dir = make_temp_dir();
    const char *schema = dir_path(dir, "s.json"), *gbnf = dir_path(dir, "g.gbnf");
    cr_assert_eq(write_text(schema, "{\"type\":\"object\",\"properties\":{\"verse\":{\"type\":\"string\"},"
                                    "\"chapter\":{\"type\":\"integer\"}},\"required\":[\"verse\",\"chapter\"],"
                                    "\"additionalProperties\":false}"), 0);
    for (int seed = 1; seed <= 3; seed++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "%s run -p 'And God said,' -n 40 --temp 1 --seed %d -t 2 --json --json-schema '%s' "
                 "2>/dev/null", tern_bin(), seed, schema);
        int rc;
        char *out = run_sh(cmd, &rc);
        cr_assert_eq(rc, 0, "%s", out);
        json_t *run = json_loads(out, 0, NULL);
        cr_assert(run, "%s", out);
        json_t *v = json_loads(json_string_value(json_object_get(run, "text")), 0, NULL);
        cr_expect(json_is_string(json_object_get(v, "verse")) && json_is_integer(json_object_get(v, "chapter")) &&
                      json_object_size(v) == 2, "%s", out);
        cr_expect_str_eq(json_string_value(json_object_get(run, "stop_reason")), "eos", "%s", out);
        json_decref(v);
        json_decref(run);
        free(out);
    }
    cr_assert_eq(write_text(gbnf, "root ::= (\"yes\" | \"no\") \", \" [a-z]{3,8} \".\"\n"), 0);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s run -p 'Is it so?' -n 20 --temp 1 --seed 2 -t 2 --grammar-file '%s' 2>/dev/null",
             tern_bin(), gbnf);
    int rc;
    char *out = run_sh(cmd, &rc);
    cr_assert_eq(rc, 0, "%s", out);
    size_t n = strlen(out), k = 0;
    cr_assert(n > 6 && (!strncmp(out, "yes, ", 5) || !strncmp(out, "no, ", 4)) && out[n - 1] == '.', "%s", out);
    for (const char *p = strchr(out, ' ') + 1; *p != '.'; p++) k += *p >= 'a' && *p <= 'z';
    cr_expect(k >= 3 && k <= 8, "%s", out);
    free(out);
    cr_assert_eq(write_text(schema, "{\"type\":\"string\",\"format\":\"uri\"}"), 0);
    char args[600];
    snprintf(args, sizeof args, "run -p hi --json-schema '%s'", schema);
    expect_fail(args, 2, "\"format\" is not supported");
    snprintf(args, sizeof args, "run -p hi --grammar-file '%s' --ignore-eos", gbnf);
    expect_fail(args, 1, "ignore_eos");
    snprintf(args, sizeof args, "run --tokens '1 2' --grammar-file '%s'", gbnf);
    expect_fail(args, 2, "--grammar-file");
    rm_rf(dir);
    free(dir);
}

Test(cli, tokenize_round_trip) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s tokenize --decode \"$(%s tokenize 'In the beginning, God')\"", tern_bin(),
             tern_bin());
    int rc;
    char *out = run_sh(cmd, &rc);
    cr_assert_eq(rc, 0);
    cr_assert_str_eq(out, "In the beginning, God\n");
    free(out);
}

/* The turn's prompt tokens when chat reads `input` (--json: one object a
 * turn); *turns: the objects printed. */
static int first_prompt(const char *input, int *turns) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "printf '%s' | %s chat --no-think --temp 0 -n 2 -t 2 --json 2>/dev/null", input,
             tern_bin());
    int rc, p = -1;
    char *out = run_sh(cmd, &rc);
    cr_assert_eq(rc, 0, "%s", out);
    *turns = 0;
    for (const char *l = out; (l = strstr(l, "\"prompt_tokens\":")); l++) {
        if (!(*turns)++) sscanf(l, "\"prompt_tokens\":%d", &p);
    }
    free(out);
    return p;
}

static int rendered(const char *message) {
    char text[512];
    snprintf(text, sizeof text, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
             message);
    return count_tokens(text);
}

/* A message of several lines: between lines of three quotes, or lines
 * ending with a backslash; each is one turn. */
Test(cli, chat_reads_a_message_of_several_lines) {
    int turns;
    cr_expect_eq(first_prompt("\"\"\"\\ndef f():\\n    return 1\\n\"\"\"\\nNext.\\n", &turns),
                 rendered("def f():\n    return 1"));
    cr_expect_eq(turns, 2);
    cr_expect_eq(first_prompt("Say it\\\\\\nagain.\\nNext.\\n", &turns), rendered("Say it\nagain."));
    cr_expect_eq(turns, 2);
    cr_expect_eq(first_prompt("\"\"\"\\nfirst\\nlast\"\"\"\\n", &turns), rendered("first\nlast"));
    cr_expect_eq(turns, 1);
    cr_expect_eq(first_prompt("one line\\n", &turns), rendered("one line"));
}

/* chat --json driven through pipes, a turn at a time: each turn's object
 * arrives before the next message is written (seen=1). */
static char *chat_by_turns(const char *then) {
    char cmd[1536];
    snprintf(cmd, sizeof cmd,
             "d=$(mktemp -d) && mkfifo $d/in && { %s chat --no-think --temp 0 -n 2 -t 2 --json <$d/in >$d/out "
             "2>/dev/null & pid=$!; exec 3>$d/in; printf 'hi\\n' >&3; seen=0; "
             "for i in $(seq 300); do [ -s $d/out ] && seen=1 && break; sleep 0.1; done; %s exec 3>&-; "
             "wait $pid; echo rc=$? seen=$seen turns=$(grep -c prompt_tokens $d/out); rm -rf $d; }",
             tern_bin(), then);
    int rc;
    return run_sh(cmd, &rc);
}

Test(cli, chat_json_answers_each_turn_through_a_pipe) {
    char *out = chat_by_turns("printf 'again\\n' >&3; sleep 0.5;");
    cr_expect_str_eq(out, "rc=0 seen=1 turns=2\n");
    free(out);
}

/* Ctrl-C while a block of lines is open ends the chat as at the prompt:
 * the half block is not sent. */
Test(cli, chat_interrupted_in_a_block_sends_nothing) {
    char *out = chat_by_turns("printf '\"\"\"\\nhalf a block\\n' >&3; sleep 0.5; kill -INT $pid; sleep 0.5;");
    cr_expect_str_eq(out, "rc=0 seen=1 turns=1\n");
    free(out);
}

/* 1 when this process (and the commands it runs) may lock memory past
 * RLIMIT_MEMLOCK (CAP_IPC_LOCK, e.g. root). */
static int can_lock_past_the_limit(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long caps = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "CapEff: %llx", &caps) == 1) break;
    if (f) fclose(f);
    return (caps >> 14) & 1;   /* CAP_IPC_LOCK */
}

/* --mlock: where RLIMIT_MEMLOCK applies and is below what the weights
 * need, the command says so in one line and fails; with CAP_IPC_LOCK the
 * limit does not apply and the run goes on (the server test checks the
 * pages are locked), as it does in the ASan build, whose runtime makes
 * mlock do nothing. */
Test(cli, mlock_names_the_limit_or_runs) {
    char cmd[512];
    int rc;
    snprintf(cmd, sizeof cmd, "sh -c 'ulimit -l 1024 && exec %s run --mlock -p Hi -n 2 -t 2 --json' 2>&1", tern_bin());
    char *out = run_sh(cmd, &rc);
#ifdef __SANITIZE_ADDRESS__
    int sanitized = 1;
#else
    int sanitized = 0;
#endif
    int refused = !can_lock_past_the_limit() && !sanitized;
    if (!refused) {
        cr_expect_eq(rc, 0, "%s", out);
        cr_expect(strstr(out, "\"generated_tokens\":2"), "%s", out);
    } else {
        cr_expect_neq(rc, 0, "%s", out);
        cr_expect(strstr(out, "mlock") && strstr(out, "RLIMIT_MEMLOCK is 1 MiB"), "%s", out);
        cr_expect_eq(strchr(out, '\n'), out + strlen(out) - 1, "not one line: %s", out);
    }
    free(out);
}

/* chat --concise: the concise prompt after the system prompt (or as it). */
static int concise_prompt(const char *flags) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "printf 'Hi\\n' | %s chat %s --no-think --temp 0 -n 1 -t 2 --json 2>/dev/null", tern_bin(),
             flags);
    int rc, p = -1;
    char *out = run_sh(cmd, &rc);
    cr_assert_eq(rc, 0, "%s", out);
    const char *l = strstr(out, "\"prompt_tokens\":");
    cr_assert(l && sscanf(l, "\"prompt_tokens\":%d", &p) == 1, "%s", out);
    free(out);
    return p;
}

Test(cli, chat_concise) {
    char text[1024];
    snprintf(text, sizeof text, "<|im_start|>system\n%s<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
             "<|im_start|>assistant\n<think>\n\n</think>\n\n", tern_concise_prompt);
    cr_expect_eq(concise_prompt("--concise"), count_tokens(text));
    snprintf(text, sizeof text, "<|im_start|>system\nBe kind.\n\n%s<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
             "<|im_start|>assistant\n<think>\n\n</think>\n\n", tern_concise_prompt);
    cr_expect_eq(concise_prompt("--concise --system 'Be kind.'"), count_tokens(text));
}
