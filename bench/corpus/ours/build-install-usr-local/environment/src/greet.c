#include <stdio.h>
#include "greet.h"

int main(int argc, char **argv) {
    char line[256];
    greet_format(line, sizeof line, argc > 1 ? argv[1] : "world");
    puts(line);
    return 0;
}
