/* The request body of POST /v1/messages/count_tokens (see srv_harness.h). */
#define SRV_ENDPOINT SRV_EP_COUNT_TOKENS
#include "srv_harness.h"
