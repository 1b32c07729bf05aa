#!/bin/bash
if [ -f /app/done ]; then r=1; else r=0; fi
printf '{"reward": %s, "files": 1}\n' "$r" > /logs/verifier/reward.json
