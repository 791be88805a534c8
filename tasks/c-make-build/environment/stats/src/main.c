#include <stdio.h>
#include "stats.h"

int main(void) {
    static double xs[100000];
    size_t n = read_numbers(xs, sizeof xs / sizeof xs[0]);
    if (n == 0) {
        fprintf(stderr, "stats: no numbers on standard input\n");
        return 1;
    }
    printf("count=%zu mean=%.3f stddev=%.3f\n", n, mean(xs, n), stddev(xs, n));
    return 0;
}
