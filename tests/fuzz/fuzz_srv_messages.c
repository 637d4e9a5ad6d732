/* The request body of POST /v1/messages (see srv_harness.h). */
#define SRV_ENDPOINT SRV_EP_MESSAGES
#include "srv_harness.h"
