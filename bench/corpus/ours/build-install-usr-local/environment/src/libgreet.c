#include <stdio.h>
#include "greet.h"

int greet_format(char *out, int size, const char *name) {
    return snprintf(out, size, "Hello, %s!", name);
}
