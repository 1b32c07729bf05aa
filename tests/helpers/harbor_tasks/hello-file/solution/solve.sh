#!/bin/bash
echo "hello $(cat /app/name.txt)" > /app/greeting.txt
