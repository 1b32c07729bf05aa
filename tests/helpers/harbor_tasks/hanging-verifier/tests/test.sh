#!/bin/bash
sleep 600
echo 1 > /logs/verifier/reward.txt
