#include <math.h>
#include "stats.h"

double mean(const double *xs, size_t n) {
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += xs[i];
    return sum / n;
}

double stddev(const double *xs, size_t n) {
    double m = mean(xs, n), acc = 0;
    for (size_t i = 0; i < n; i++) acc += (xs[i] - m) * (xs[i] - m);
    return sqrt(acc / n);
}
