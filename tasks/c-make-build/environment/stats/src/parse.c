#include <stdio.h>
#include "stats.h"

size_t read_numbers(double *out, size_t max) {
    size_t n = 0;
    while (n < max && scanf("%lf", &out[n]) == 1) n++;
    return n;
}
