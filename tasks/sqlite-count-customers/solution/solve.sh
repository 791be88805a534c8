#!/bin/bash
sqlite3 /data/shop.db "SELECT COUNT(*) FROM customers WHERE city = 'Oslo';" > /app/answer.txt
