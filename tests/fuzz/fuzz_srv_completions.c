/* The request body of POST /v1/completions (see srv_harness.h). */
#define SRV_ENDPOINT SRV_EP_COMPLETIONS
#include "srv_harness.h"
