#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "tern.h"
#include "util/err.h"

/* K/M/G/T are binary multiples (1024-based), as memory budgets usually are;
 * "KB"/"KiB"/"K" all mean the same. */
int tern_parse_size(const char *s, uint64_t *bytes, tern_error *err) {
    if (!s || !*s) return tern_fail(err, "empty size");
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v >= 0) || isinf(v)) return tern_fail(err, "'%s' is not a size", s);
    while (isspace((unsigned char)*end)) end++;
    static const char units[] = "KMGT";
    double mult = 1;
    if (*end) {
        const char *u = strchr(units, toupper((unsigned char)*end));
        if (!u) return tern_fail(err, "'%s': unknown unit (use K, M, G or T)", s);
        mult = pow(1024.0, (double)(u - units + 1));
        end++;
        if (!strcasecmp(end, "iB") || !strcasecmp(end, "B")) end += strlen(end);
        if (*end) return tern_fail(err, "'%s': unknown unit (use K, M, G or T)", s);
    }
    double b = v * mult;
    if (b > 1.8e19) return tern_fail(err, "'%s' is too large", s);
    *bytes = (uint64_t)b;
    return 0;
}
