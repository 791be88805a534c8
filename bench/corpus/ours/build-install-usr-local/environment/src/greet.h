#ifndef GREET_H
#define GREET_H
/* Writes "Hello, NAME!" into out (at most size bytes); returns the length it wanted. */
int greet_format(char *out, int size, const char *name);
#endif
