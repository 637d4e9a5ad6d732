/* The chat template (tern_chat_render) on the JSON the CLI and the server
 * give it: "MESSAGES_JSON" or "MESSAGES_JSON\0TOOLS_JSON" after a first
 * byte of options (bit 0 add_generation_prompt, 1 enable_thinking,
 * 2 preserve_thinking, 3 add_vision_id). A rendered prompt must be valid
 * UTF-8 (its input is: JSON strings are) and, with a generation prompt,
 * end with the assistant's turn. */
#include "fuzz.h"
#include "tern.h"
#include "text/utf8.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    tern_chat_options opt;
    tern_chat_options_default(&opt);
    opt.add_generation_prompt = data[0] & 1;
    opt.enable_thinking = data[0] >> 1 & 1;
    opt.preserve_thinking = data[0] >> 2 & 1;
    opt.add_vision_id = data[0] >> 3 & 1;
    char *in = fuzz_strndup(data + 1, size - 1);
    size_t mlen = strlen(in);
    const char *tools = mlen + 1 < size ? in + mlen + 1 : NULL;
    tern_error err;
    char *out = tern_chat_render(in, tools, &opt, &err);
    if (out) {
        size_t n = strlen(out);
        FUZZ_CHECK(tern_utf8_valid_prefix(out, n) == n, "the prompt is not valid UTF-8");
        const char *tail = opt.enable_thinking ? "<|im_start|>assistant\n<think>\n"
                                               : "<|im_start|>assistant\n<think>\n\n</think>\n\n";
        FUZZ_CHECK(!opt.add_generation_prompt || (n >= strlen(tail) && !strcmp(out + n - strlen(tail), tail)),
                   "the generation prompt is missing");
        free(out);
    } else {
        FUZZ_NOTE("%s", err.msg);
        FUZZ_CHECK(err.msg[0], "render failed without a message");
    }
    free(in);
    return 0;
}
