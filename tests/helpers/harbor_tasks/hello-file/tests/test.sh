#!/bin/bash
# Reward 1 when /app/greeting.txt is "$GREETING harbor" ([verifier] env), else 0.
if [ "$(cat /app/greeting.txt 2>/dev/null)" = "$GREETING $(cat /app/name.txt)" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
