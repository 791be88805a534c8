#!/bin/bash
find /var/data -type f -size +1048576c | LC_ALL=C sort > /app/large_files.txt
