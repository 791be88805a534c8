#!/bin/bash
set -e
cd /app/stats
sed -i 's|^OBJS = .*|OBJS = src/main.o src/parse.o src/summary.o|' Makefile
sed -i 's|\$(CC) \$(CFLAGS) -o \$@ \$(OBJS)$|$(CC) $(CFLAGS) -o $@ $(OBJS) -lm|' Makefile
make clean
make
