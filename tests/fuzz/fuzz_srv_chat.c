/* The request body of POST /v1/chat/completions (see srv_harness.h). */
#define SRV_ENDPOINT SRV_EP_CHAT
#include "srv_harness.h"
