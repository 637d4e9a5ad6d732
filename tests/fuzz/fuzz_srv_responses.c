/* The request body of POST /v1/responses (see srv_harness.h). */
#define SRV_ENDPOINT SRV_EP_RESPONSES
#include "srv_harness.h"
