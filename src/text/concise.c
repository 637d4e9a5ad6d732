#include "text/concise.h"

const char *const tern_concise_prompt =
    "Answer concisely: the answer first, without preamble, restating the question or a closing summary; the "
    "fewest words that are complete and correct. Code, commands and exact output stay whole.";
