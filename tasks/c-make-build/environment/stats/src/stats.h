#ifndef STATS_H
#define STATS_H
#include <stddef.h>

size_t read_numbers(double *out, size_t max);
double mean(const double *xs, size_t n);
double stddev(const double *xs, size_t n);

#endif
